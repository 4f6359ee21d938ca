"""The embedded default: a child process on the worker, holding the GPUs the host allocator gave it.

The executor backend runs its tasks with this class too (its options are :class:`WorkerOptions` as well): the
task is already on a GPU worker, pod or queue that Airflow's executor chose. Logs and locks name the backend of
the options (``options.backend``).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.backends.base import Backend
from airflow_gpu_provider.backends.local.process import TaskProcess, reap_orphans
from airflow_gpu_provider.backends.local.venv import ensure_venv, venv_in_use
from airflow_gpu_provider.backends.options import WorkerOptions
from airflow_gpu_provider.checkpoint.location import checkpoint_environment
from airflow_gpu_provider.host.allocator import HostGpus
from airflow_gpu_provider.host.mps import ShareEnforcer, shared
from airflow_gpu_provider.host.quarantine import on_fault
from airflow_gpu_provider.host.state import left_by_dead_workers, runtime_file, task_folder
from airflow_gpu_provider.settings.units import format_bytes, parse_bytes
from airflow_gpu_provider.task.environment import thread_environment, visible_devices
from airflow_gpu_provider.task.modules import python_path
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.result import TaskResult, read_result_file, task_result

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_gpu_provider.config.worker import GpuConfig


@dataclass(frozen=True)
class LocalPlan:
    """How the child process is started. Built by :meth:`LocalBackend.plan`, without touching the host.

    :param environment: variables added to the worker's environment (visible devices come at run time)
    """

    request: TaskRequest
    host: HostGpus
    environment: Mapping[str, str] = field(default_factory=dict)
    kill_grace: float = 10.0
    cache_size: int = 0  # [gpu] cache_size: bytes the cached venvs may take (0: no limit)
    allow_unenforced_shares: bool = False  # [gpu_policy] allow_unenforced_gpu_shares (host/mps.py)


class LocalBackend(Backend[WorkerOptions, LocalPlan]):
    """Run the task in a child process (its own process group) on the worker."""

    name = "local"

    def __init__(self, options: WorkerOptions, log: Any = None) -> None:
        super().__init__(options, log)
        self._task: TaskProcess | None = None

    def plan(self, request: TaskRequest, conf: GpuConfig) -> LocalPlan:
        """Translate a request: thread variables, image environment, the checkpoint folder, the host's GPUs. No I/O."""
        checkpoint = None if request.checkpoint is None else request.checkpoint.path
        return LocalPlan(
            request=request,
            host=HostGpus.configured(conf, only=self.options.device_ids),
            environment={
                "PYTHONUNBUFFERED": "1",
                **thread_environment(request.resources, request.processes_per_node),
                **request.image.environment,
                **checkpoint_environment(checkpoint),
            },
            kill_grace=conf.grace(self.options.kill_grace),
            cache_size=parse_bytes(conf.cache_size) if conf.cache_size else 0,
            allow_unenforced_shares=conf.allow_unenforced_gpu_shares,
        )

    # ------------------------------------------------------------------ run
    def run(self, plan: LocalPlan, context: Context) -> TaskResult:
        """Build or reuse the venv, take the GPUs, run the child, stream its output; always clean up."""
        request = plan.request
        if request.resources.memory is not None:
            self.log.info(
                "memory=%s is not enforced by the local backend (docker and kubernetes enforce it)",
                format_bytes(request.resources.memory),
            )
        runtime = runtime_file(plan.host.state_dir)
        with self._interpreter(plan, runtime) as (python, image_name, in_use):
            return self._run_child(plan, runtime, python, image_name, in_use)

    @contextlib.contextmanager
    def _interpreter(self, plan: LocalPlan, runtime: Path) -> Iterator[tuple[Path, str, list[int]]]:
        """The task's Python: the worker's, or a cached venv with the requirements, held in use while the task runs.

        :return: the interpreter, its name in the log, and the use file's descriptor to pass on to the task
        """
        image, name = plan.request.image, f"worker python {platform.python_version()}"
        if not image.requirements:
            yield Path(sys.executable), name, []
            return
        venvs = Path(plan.host.state_dir) / "venvs"
        with venv_in_use(venvs, image) as in_use:  # never removed while a process of the task lives
            python = ensure_venv(image, venvs, self.log, runtime=runtime, cache_size=plan.cache_size)
            yield python, f"{name} + venv {python.parent.parent.name}", [in_use]

    def _run_child(
        self, plan: LocalPlan, runtime: Path, python: Path, image_name: str, in_use: list[int]
    ) -> TaskResult:
        request = plan.request
        if request.checkpoint is not None and not request.checkpoint.is_uri:
            request.checkpoint.make(request.labels)  # 0700, the worker's own: the same folder for the next try
        if left_by_dead_workers(Path(plan.host.state_dir) / "tasks"):  # a dead worker's task may still hold a GPU
            reap_orphans(self.log)  # before any GPU is taken
        enforcer = None
        if request.resources.share is not None:  # MPS, PyTorch's cap or nothing (host/mps.py)
            enforcer = ShareEnforcer(plan.host.state_dir, self.log, in_container=False,
                                     allow_unenforced=plan.allow_unenforced_shares)  # fmt: skip
        daemon = None if enforcer is None else enforcer.daemon
        allocation = plan.host.allocate(request, backend=self.options.backend, log=self.log, daemon=daemon)
        survivors: list[int] = []
        try:
            share = None if enforcer is None else shared(enforcer, allocation, request)
            with _task_folder(plan.host.state_dir) as workdir:
                ids = [device.id for device in allocation.devices]
                environment = {**os.environ, **plan.environment, **visible_devices(request.resources.gpu_vendor, ids)}
                environment.update(python_path(request.project_path, environment.get("PYTHONPATH")))
                environment.update(share.environment if share is not None else {})
                envelope = request.runtime_envelope(
                    backend=self.options.backend,
                    image=image_name,
                    gpus=[device.describe() for device in allocation.devices],
                    cpu_fallback=allocation.cpu_fallback,
                    fallback_reason=allocation.reason,
                    die_with_parent=True,
                    share=None if share is None else share.share,
                )
                envelope_path = Path(workdir, "envelope.json")
                result_path = Path(workdir, "result.json")
                envelope_path.write_text(json.dumps(envelope))
                argv = [str(python), str(runtime), str(envelope_path), str(result_path)]
                self.log.info("Starting task process on GPUs %s", ids or "none")
                task = TaskProcess(
                    argv,
                    environment,
                    cwd=workdir,
                    pass_fds=[*allocation.fds, *in_use],
                    log=self.log,
                    kill_grace=plan.kill_grace,
                    state_dir=plan.host.state_dir,
                )
                self._task = task
                try:
                    exit_code = task.wait()
                finally:
                    survivors = task.stop()  # whatever the task left running, whatever it did to escape
                    self._task = None
                result = read_result_file(result_path)
        finally:
            if survivors:  # never hand out GPUs that a process of this task may still use
                self.log.error(
                    "Processes %s of the task survived SIGKILL: its GPUs stay locked until they end.", survivors
                )
            else:
                allocation.release()
        with on_fault(plan.host, allocation.devices, self.log, positional=False):  # an Xid, ECC: quarantined
            return task_result(result, exit_code, where="the local task process")

    def kill(self) -> None:
        """Called from ``on_kill`` (inside a signal handler): SIGTERM the task's whole tree, SIGKILL after the grace.

        One signal to the task's supervisor, which does the rest: the thread running the task waits for it, then
        releases the GPUs.
        """
        task = self._task
        if task is not None:
            task.terminate()


@contextlib.contextmanager
def _task_folder(state_dir: str) -> Iterator[str]:
    """A private folder for the task's envelope and result, in the state dir; removed after, or by the next task."""
    folder = task_folder(Path(state_dir) / "tasks")
    try:
        yield str(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
