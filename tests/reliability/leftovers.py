"""What one cell of the failure matrix left behind: only its own, so that it holds beside other cells and runs.

Each cell has a :class:`Scope`: a token (:attr:`Scope.token`), which its workers carry in their environment
(:data:`RUN_VARIABLE`) and every process they start inherits; its workers' identities (``host:pid:start``), with
which the provider labels what a worker makes (task containers: ``airflow-gpu-provider.worker``; build containers
and images: ``airflow-gpu-provider.builder``); the pod-in-docker containers of a Kubernetes cell carry the token as a
label; its temp folders go in the cell's own folder; its GPU locks in its state dir. A process that clears its
environment is named by the scenario that started it (a file in :attr:`Scope.pids`: its pid and start time); an
image only this cell builds is known by its requirements hash (:attr:`Scope.requirements`). A Ray cell's jobs name
their worker in their metadata; the Ray cluster is the matrix's own, and its Ray cells run one at a time (only they
start anything on it): the actors and placement groups that appear during a Ray cell are that cell's. A Slurm cell's
jobs name their worker in their comment, and the job folders that appear during it (one at a time) are its. Other
cells' and runs' processes, containers, images and folders are never counted.
"""

from __future__ import annotations

import atexit
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_gpu_provider.host.workers import started_at

RUN_VARIABLE = "AIRFLOW_GPU_MATRIX_RUN"
RUN_LABEL = "airflow-gpu-provider-test.run"
FOLDER = Path(tempfile.mkdtemp(prefix="airflow-gpu-matrix-"))  # the cells' folders
atexit.register(shutil.rmtree, FOLDER, ignore_errors=True)
LEFTOVERS = (
    "processes",
    "containers",
    "GPU locks",
    "temp dirs",
    "images",
    "Ray jobs",
    "Ray actors",
    "placement groups",
    "Slurm jobs",
)
DEVICES = ("0", "1")
TMP_PREFIXES = ("airflow-gpu-netrc-", "airflow-gpu-ranks-", "pod-in-docker-", "airflow-gpu-ray-", "airflow-gpu-node-")
WORKER_LABELS = ("airflow-gpu-provider.worker", "airflow-gpu-provider.builder")


@dataclass
class Scope:
    """What one cell owns, to count its leftovers by.

    :param ray_address: the Jobs API of the matrix's Ray cluster, for a Ray cell (its jobs, actors and placement
        groups are counted); empty for the other cells (they start nothing on the cluster)
    :param slurm_conf: the tests' Slurm cluster's configuration, for a Slurm cell (its active jobs and job folders
        are counted: a job's comment names its worker; one Slurm cell at a time, so new folders are the cell's)
    """

    ray_address: str = ""
    slurm_conf: str = ""
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(dir=FOLDER)))
    workers: set[str] = field(default_factory=set)  # its workers' identities (host:pid:start)
    requirements: set[str] = field(default_factory=set)  # hashes of images only it builds (its own index's URL)

    def __post_init__(self) -> None:
        self.tmp.mkdir(exist_ok=True)
        self.pids.mkdir(exist_ok=True)

    @property
    def tmp(self) -> Path:
        """Its workers' TMPDIR, and the pod-in-docker volumes' parent."""
        return self.folder / "tmp"

    @property
    def pids(self) -> Path:
        """Processes a scenario started that carry nothing of the cell."""
        return self.folder / "pids"

    def add_worker(self, pid: int) -> None:
        """Record a worker, by its identity (as :func:`~airflow_gpu_provider.host.workers.worker_identity`)."""
        self.workers.add(f"{socket.gethostname()}:{pid}:{started_at(pid)}")


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _processes(scope: Scope) -> set[str]:
    """The cell's processes that still run: those with its token, and those its scenario named."""
    found = set()
    marker = f"{RUN_VARIABLE}={scope.token}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0") and _running(int(entry.name)):
                    found.add(f"pid {entry.name}")
            except OSError:
                continue
    for named in scope.pids.iterdir():
        if started_at(int(named.name)) == named.read_text().strip() and _running(int(named.name)):
            found.add(f"pid {named.name} (no token)")
    return found


def _client() -> Any:
    try:
        import docker

        client = docker.APIClient(version="auto", timeout=60)
        client.ping()
    except Exception:
        return None
    return client


def _ours(scope: Scope, labels: dict[str, str] | None) -> bool:
    labels = labels or {}
    if labels.get("airflow-gpu-provider.requirements-hash") in scope.requirements:
        return True
    return labels.get(RUN_LABEL) == scope.token or any(labels.get(label) in scope.workers for label in WORKER_LABELS)


def _containers(scope: Scope, client: Any) -> set[str]:
    if client is None:
        return set()
    return {f"container {c['Id'][:12]}" for c in client.containers(all=True) if _ours(scope, c.get("Labels"))}


def _images(scope: Scope, client: Any) -> set[str]:
    """Images the cell's builds left: untagged ones that no image is built on (a failed or killed build's)."""
    if client is None:
        return set()
    found = client.images(all=True, filters={"dangling": True, "label": "airflow-gpu-provider.derived"})
    return {f"image {i['Id'].split(':')[-1][:12]}" for i in found if _ours(scope, i.get("Labels"))}


def _locks(state_dir: Path) -> set[str]:
    from airflow_gpu_provider.host.allocator import GpuAllocator
    from airflow_gpu_provider.host.inventory import Device

    allocator = GpuAllocator(state_dir / "locks")
    return {f"GPU {d}: {holder}" for d in DEVICES if (holder := allocator.holder_of(Device(d))) is not None}


def _temp_dirs(scope: Scope, state_dir: Path) -> set[str]:
    found = {str(p) for folder in ("tasks", "docker-tasks", "venvs") for p in (state_dir / folder).glob("*")}
    return found | {str(p) for prefix in TMP_PREFIXES for p in scope.tmp.glob(f"{prefix}*")}


def _ray(scope: Scope) -> dict[str, set[str]]:
    """A Ray cell's jobs the cluster still lists; the cluster's live actors and placement groups (the matrix's own
    cluster, one Ray cell at a time: what appeared during the cell is the cell's)."""
    address = scope.ray_address
    if not address:
        return {"Ray jobs": set(), "Ray actors": set(), "placement groups": set()}
    from backends.ray.ray_cluster import client, state
    from ray.util.state.common import ListApiOptions, StateResource

    jobs = client(address).list_jobs()

    def listed(resource: StateResource, filters: list[Any]) -> list[Any]:
        return list(state(address).list(resource, ListApiOptions(filters=filters, timeout=30), False))

    actors = listed(StateResource.ACTORS, [("state", "!=", "DEAD")])
    groups = listed(StateResource.PLACEMENT_GROUPS, [("state", "!=", "REMOVED")])
    return {
        "Ray jobs": {
            f"job {j.submission_id} ({j.status})" for j in jobs if (j.metadata or {}).get("worker") in scope.workers
        },
        "Ray actors": {f"actor {a.actor_id[:12]} ({a.class_name})" for a in actors},
        "placement groups": {f"placement group {g.placement_group_id[:12]}" for g in groups},
    }


def _slurm(scope: Scope) -> set[str]:
    """A Slurm cell's jobs that still run (their comment names the cell's worker) and the job folders there are."""
    if not scope.slurm_conf:
        return set()
    import json
    import os
    import subprocess

    from airflow_gpu_provider.backends.slurm.states import ACTIVE

    environment = {**os.environ, "SLURM_CONF": scope.slurm_conf}
    out = subprocess.run(["squeue", "--json"], env=environment, capture_output=True, text=True, check=True).stdout
    jobs = {
        f"job {j['job_id']} ({j['job_state']})"
        for j in json.loads(out)["jobs"]
        if any(worker in j.get("comment", "") for worker in scope.workers) and j["job_state"] in ACTIVE
    }
    shared = Path(scope.slurm_conf).parents[1] / "shared"
    return jobs | {f"job folder {p.name}" for p in shared.glob("airflow-gpu-*/job-*")}


def snapshot(scope: Scope, state_dir: Path) -> dict[str, set[str]]:
    """Everything of the cell that counts as a leftover, as it is now."""
    client = _client()
    return {
        "processes": _processes(scope),
        "containers": _containers(scope, client),
        "GPU locks": _locks(state_dir),
        "temp dirs": _temp_dirs(scope, state_dir),
        "images": _images(scope, client),
        **_ray(scope),
        "Slurm jobs": _slurm(scope),
    }


def settle(scope: Scope, state_dir: Path, before: dict[str, set[str]], timeout: float = 10) -> dict[str, list[str]]:
    """What appeared since ``before`` and is still there (a removal in flight gets ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        after = snapshot(scope, state_dir)
        left = {name: sorted(after[name] - before[name]) for name in LEFTOVERS}
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.5)
