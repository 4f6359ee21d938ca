"""The embedded default: a child process on the worker, holding the GPUs the host allocator gave it."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_gpu_provider import config
from airflow_gpu_provider.backends.base import Backend, TaskRequest, TaskResult, result_value
from airflow_gpu_provider.host.allocator import Allocation, allocate_gpus
from airflow_gpu_provider.host.inventory import host_devices
from airflow_gpu_provider.host.venv import ensure_venv
from airflow_gpu_provider.runtime import BOOTSTRAP_PATH
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.settings.units import format_bytes

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
KILL_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class LocalPlan:
    """How the child process is started. Built by :meth:`LocalBackend.plan`, without touching the host.

    :param environment: variables added to the worker's environment (visible devices come at run time)
    """

    resources: ResourceSettings
    image: ImageSettings
    envelope: Mapping[str, Any]
    on_missing_gpu: str
    holder: str
    environment: Mapping[str, str] = field(default_factory=dict)
    devices_option: str = "auto"
    state_dir: str = "/var/tmp/airflow-gpu-provider"
    poll_interval: float = 5.0
    kill_grace: float = KILL_GRACE_SECONDS


class LocalBackend(Backend[LocalPlan]):
    """Run the task in a child process (its own process group) on the worker.

    Options (``backend_options``): ``devices`` and ``state_dir`` override ``[gpu] devices`` / ``[gpu] state_dir``;
    ``kill_grace`` is the seconds between SIGTERM and SIGKILL when the task is stopped.
    """

    name = "local"
    option_names = frozenset({"devices", "state_dir", "kill_grace"})

    def __init__(self, options: Mapping[str, Any] | None = None, log: Any = None) -> None:
        super().__init__(options, log)
        self._process: subprocess.Popen[bytes] | None = None

    def plan(self, request: TaskRequest) -> LocalPlan:
        """Translate a request: GPU count, thread variables, image environment. No I/O."""
        request.require_single_node(self.name)
        resources = request.resources
        environment = {"PYTHONUNBUFFERED": "1", **request.image.environment}
        if resources.cpu_count is not None:
            threads = str(max(1, math.ceil(resources.cpu_count)))
            for variable in THREAD_VARIABLES:
                environment.setdefault(variable, threads)
        return LocalPlan(
            resources=resources,
            image=request.image,
            envelope=request.envelope,
            on_missing_gpu=request.on_missing_gpu,
            holder=f"{request.display_name} run {request.labels.get('run_id', '?')}",
            environment=environment,
            devices_option=str(self.options.get("devices", config.get("devices"))),
            state_dir=str(self.options.get("state_dir", config.get("state_dir"))),
            poll_interval=config.get("wait_poll_interval"),
            kill_grace=float(self.options.get("kill_grace", KILL_GRACE_SECONDS)),
        )

    # ------------------------------------------------------------------ run
    def run(self, plan: LocalPlan) -> TaskResult:
        """Build or reuse the venv, take the GPUs, run the child, stream its output; always clean up."""
        resources = plan.resources
        if resources.memory is not None:
            self.log.info(
                "memory=%s is not enforced by the local backend (docker and kubernetes enforce it)",
                format_bytes(resources.memory),
            )
        python = Path(sys.executable)
        image_name = f"worker python {platform.python_version()}"
        if plan.image.requirements:
            python = ensure_venv(plan.image, Path(plan.state_dir) / "venvs", self.log)
            image_name += f" + venv {python.parent.parent.name}"

        with self._allocate(plan) as allocation, tempfile.TemporaryDirectory(prefix="airflow-gpu-") as workdir:
            environment = {**os.environ, **plan.environment, **self._visible_devices(plan, allocation)}
            envelope = dict(plan.envelope)
            envelope["die_with_parent"] = True
            envelope["summary"] = {
                "backend": self.name,
                "image": image_name,
                "requirements_hash": plan.image.requirements_hash,
                "resources": resources.describe() + (" -> CPU fallback" if allocation.cpu_fallback else ""),
                "gpus": [device.describe() for device in allocation.devices],
            }
            envelope_path = Path(workdir, "envelope.json")
            result_path = Path(workdir, "result.json")
            envelope_path.write_text(json.dumps(envelope))
            exit_code = self._run_child(
                [str(python), str(BOOTSTRAP_PATH), str(envelope_path), str(result_path)],
                environment,
                workdir,
                allocation,
                plan.kill_grace,
            )
            result = json.loads(result_path.read_text()) if result_path.exists() else None
        return TaskResult(result_value(result, exit_code, where="the local task process"), exit_code)

    def _allocate(self, plan: LocalPlan) -> Allocation:
        requests_gpus = plan.resources.requests_gpus
        present = host_devices(plan.devices_option, plan.resources.gpu_vendor) if requests_gpus else []
        return allocate_gpus(
            plan.resources,
            present,
            policy=plan.on_missing_gpu,  # type: ignore[arg-type]
            state_dir=plan.state_dir,
            holder=plan.holder,
            log=self.log,
            poll_interval=plan.poll_interval,
        )

    @staticmethod
    def _visible_devices(plan: LocalPlan, allocation: Allocation) -> dict[str, str]:
        variable = plan.resources.gpu_vendor.visible_devices_env
        environment = {variable: ",".join(device.id for device in allocation.devices)}
        if variable == "CUDA_VISIBLE_DEVICES":
            environment["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # indices mean what NVML says they mean
        return environment

    def _run_child(
        self, argv: list[str], environment: Mapping[str, str], workdir: str, allocation: Allocation, kill_grace: float
    ) -> int:
        self.log.info("Starting task process on GPUs %s", [d.id for d in allocation.devices] or "none")
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(environment),
            cwd=workdir,
            start_new_session=True,
            pass_fds=tuple(allocation.fds),
        )
        self._process = process
        try:
            assert process.stdout is not None
            for raw in process.stdout:
                self.log.info("%s", raw.decode(errors="replace").rstrip("\n"))
            return process.wait()
        finally:
            self._stop_group(process, kill_grace)
            self._process = None

    def _stop_group(self, process: subprocess.Popen[bytes], grace: float) -> None:
        """Stop the child and everything it started (its process group): SIGTERM, then SIGKILL."""
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        _signal_group(process.pid, signal.SIGKILL)  # also reaps grandchildren left in the group
        process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def kill(self) -> None:
        """Called from ``on_kill``: stop the child's whole process group."""
        process = self._process
        if process is not None:
            self._stop_group(process, float(self.options.get("kill_grace", KILL_GRACE_SECONDS)))


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
