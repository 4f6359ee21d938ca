"""A real two-node Ray cluster on this machine, for the Ray backend's tests: ``ray start`` twice, as a user would.

It runs with Ray's token auth (``RAY_AUTH_MODE=token`` and a token file of its own, as docs/ray.md says to start a
cluster): every client here sends the token (:func:`client`, :func:`state`), and the tasks reach the cluster
through the ``ray_default`` connection, whose password is the token (the fixture sets ``AIRFLOW_CONN_RAY_DEFAULT``).

Each node declares two logical GPUs (``--num-gpus 2``; Ray sets ``CUDA_VISIBLE_DEVICES`` for what it assigns) and a
label the tests select on (``gpu-model``: ``A100`` on the head, ``H100`` on the second node). Every port is a free
one picked here and the cluster has a temp dir of its own (one for both nodes: a node's dashboard agent reads a
job's log from the cluster's session folder): other test runs share this machine, and nothing here touches their
clusters. The second node has an address of its own (127.0.0.2; Ray replaces 127.0.0.1 with the
host's address): Ray tells nodes apart by address where it fetches a job's log from the node that ran it. ``ray start --block`` keeps each node under its own process (a session of its own): a
node is stopped by signalling that process group, never by a global ``ray stop``, which would end every cluster
of this user.

One temp dir for both nodes has a cost: their runtime_env agents unpack a job's ``working_dir`` into the same
folder, each as its own, and one removes it (to unpack it afresh, or once its own job has ended) while the other
node's job runs there. Ray names that folder by the ``working_dir``'s content hash: tests that run two jobs at once
give them different arguments (different envelopes), as two different task runs have on a real cluster anyway.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

RAY = str(Path(sys.executable).with_name("ray"))
#: a node ends (``ray start --block`` stops its processes on SIGTERM) when the test process that started it dies
_DIE_WITH_TESTS = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); os.execv(sys.argv[1], sys.argv[1:])"
)
MODELS = ("A100", "H100")  # the gpu-model label of the head and of the second node
START_TIMEOUT = 180.0


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports (held open together while they are picked)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in sockets]


@dataclass
class RayCluster:
    """A running cluster: its Jobs API (dashboard) address, its nodes' processes and folders."""

    address: str = ""  # http://127.0.0.1:PORT, the dashboard: what JobSubmissionClient takes
    gcs: str = ""  # 127.0.0.1:PORT, what ray.init and a joining node take
    token: str = field(default_factory=lambda: secrets.token_hex(32))  # Ray's token auth: the cluster's one secret
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def _node(self, name: str, model: str, ip: str, *, head: bool) -> None:
        if head:  # one temp dir for the cluster, its own: short, as Ray's socket paths must fit
            self.folders.append(Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp")))
            token = self.folders[0].with_name(f"{self.folders[0].name}-token")
            token.touch(mode=0o600)
            token.write_text(self.token)
            self.folders.append(token)  # removed with the folders
        folder = self.folders[0]
        ports = free_ports(9)
        argv = [
            sys.executable, "-c", _DIE_WITH_TESTS,
            RAY, "start", "--block", "--disable-usage-stats", "--num-cpus", "2", "--num-gpus", "2",
            "--labels", f"gpu-model={model}", "--temp-dir", str(folder), "--node-ip-address", ip,
            "--node-manager-port", str(ports[0]), "--object-manager-port", str(ports[1]),
            "--runtime-env-agent-port", str(ports[2]), "--dashboard-agent-grpc-port", str(ports[3]),
            "--dashboard-agent-listen-port", str(ports[4]), "--metrics-export-port", str(ports[5]),
            "--min-worker-port", "0", "--max-worker-port", "0", "--object-store-memory", str(200 * 2**20),
        ]  # fmt: skip
        if head:
            argv += ["--head", "--port", str(ports[6]), "--dashboard-port", str(ports[7]),
                     "--dashboard-host", "127.0.0.1", "--ray-client-server-port", str(ports[8])]  # fmt: skip
            self.gcs, self.address = f"127.0.0.1:{ports[6]}", f"http://127.0.0.1:{ports[7]}"
        else:
            argv += ["--address", self.gcs]
        log = folder.with_name(f"{folder.name}-{name}.log")
        self.logs.append(log)
        # the test process's CUDA_VISIBLE_DEVICES="" (conftest) would leave Ray no device for its logical GPUs
        environment = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        environment["RAY_USAGE_STATS_ENABLED"] = "0"
        environment.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=f"{folder}-token")
        # a runtime_env that fails to install fails once, not three times (each a fresh venv and resolve: ~1 min)
        environment["RUNTIME_ENV_RETRY_TIMES"] = "1"
        # a job's `python` is the nodes' Python, as on a cluster whose image or venv has Ray: this one's
        environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        with log.open("wb") as out:
            self.processes.append(
                subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=environment, start_new_session=True)
            )

    def start(self, nodes: int = 2) -> RayCluster:
        """Start the head, then the second node; return once the Jobs API sees the nodes."""
        self._node("head", MODELS[0], "127.0.0.1", head=True)
        self._wait_for(nodes=1)
        if nodes > 1:
            self._node("node2", MODELS[1], "127.0.0.2", head=False)
            self._wait_for(nodes=2)
        return self

    def _wait_for(self, nodes: int) -> None:
        from ray.util.state.common import ListApiOptions, StateResource

        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for process, log in zip(self.processes, self.logs, strict=True):
                if process.poll() is not None:
                    raise RuntimeError(f"ray start exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(Exception):
                found = state(self.address, self.token).list(StateResource.NODES, ListApiOptions(timeout=10), False)
                alive = [n for n in found if n.state == "ALIVE"]
                if len(alive) >= nodes:
                    return
            time.sleep(1)
        tails = "\n".join(log.read_text()[-2000:] for log in self.logs)
        raise RuntimeError(f"the Ray cluster did not have {nodes} node(s) within {START_TIMEOUT:.0f}s:\n{tails}")

    def stop(self) -> None:
        """Stop the nodes (the second first) by their own process groups, then remove their folders."""
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10  # a node's graceful stop takes ~30 s: its group goes 10 s after SIGTERM
        for process in reversed(self.processes):  # (one deadline for both: they stop side by side)
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for process in self.processes:  # what the node left in its group (raylet, workers) goes with it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for path in [*self.folders, *self.logs]:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


@contextlib.contextmanager
def ray_cluster(nodes: int = 2) -> Iterator[RayCluster]:
    """A started cluster (the head, and a second node unless ``nodes=1``), stopped on every path."""
    cluster = RayCluster()
    try:
        yield cluster.start(nodes)
    finally:
        cluster.stop()


# ---------------------------------------------------------------------------------------------- fixtures
IN_CI = os.environ.get("CI") == "true"


@pytest.fixture(scope="session")
def ray_cluster_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Jobs API address of a two-node cluster that this session starts (once) and stops.

    Without ``ray`` (the provider's ``ray`` extra) the Ray tests skip, saying so; in CI they fail. A cluster that
    cannot start is an error everywhere.
    """
    if importlib.util.find_spec("ray") is None:
        reason = "ray is not installed (pip install 'airflow-gpu-provider[ray]'; make venv installs it)"
        if IN_CI:
            pytest.fail(f"CI=true but {reason}", pytrace=False)
        pytest.skip(reason)
    from backends.docker.docker_fixtures import make_wheel

    wheels = tmp_path_factory.mktemp("ray-wheels")
    make_wheel(wheels, "airflow_gpu_private", "1.0", "SECRET_PACKAGE = True\n")
    with ray_cluster() as cluster:
        connection = {"conn_type": "ray", "password": cluster.token, "extra": {"address": cluster.address}}
        variables = {
            "AIRFLOW_GPU_TEST_RAY_ADDRESS": cluster.address,
            "AIRFLOW_GPU_TEST_WHEELS": str(wheels),
            "AIRFLOW_CONN_RAY_DEFAULT": json.dumps(connection),  # the tasks' cluster, with its token
        }
        os.environ.update(variables)
        try:
            yield cluster.address
        finally:
            for name in variables:
                os.environ.pop(name, None)


def _token(token: str | None) -> str:
    """The tests' cluster's token (from the connection the fixture sets), unless given."""
    if token is not None:
        return token
    return str(json.loads(os.environ.get("AIRFLOW_CONN_RAY_DEFAULT", "{}")).get("password", ""))


def client(address: str, token: str | None = None) -> Any:
    """A Jobs API client of the tests' cluster, with its token (as every holder of the token can have one)."""
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address, headers={"Authorization": f"Bearer {_token(token)}"})


def state(address: str, token: str | None = None) -> Any:
    """Ray's state API client of the tests' cluster, with its token."""
    from ray.util.state.api import StateApiClient

    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {_token(token)}"}
    return StateApiClient(address, headers=headers)


def jobs(address: str) -> list[Any]:
    """The provider's jobs the cluster still knows (each task deletes its own once it has ended)."""
    return [j for j in client(address).list_jobs() if (j.metadata or {}).get("airflow_gpu_provider")]
