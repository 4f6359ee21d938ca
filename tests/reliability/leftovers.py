"""What one run of the failure matrix left behind: only its own, so that it holds beside other runs on a busy host.

A run has a token (:data:`RUN`). Its workers carry it in their environment (:data:`RUN_VARIABLE`), and every process
they start inherits it; their identities (``host:pid:start``) are recorded, and the provider labels what a worker
makes with its identity (task containers: ``airflow-gpu-provider.worker``; build containers and images:
``airflow-gpu-provider.builder``); the pod-in-docker containers of its Kubernetes cells carry the run's label; its
temp folders go in the run's own folder; its GPU locks in each cell's state dir. A process that clears its
environment is named by the scenario that started it (a file in :data:`PIDS`: its pid and start time); an image
only this run builds is known by its requirements hash (:data:`REQUIREMENTS`).
Its Ray cells' jobs name their worker in their metadata; the Ray cluster is the matrix's own (its actors and placement
groups that appear during a cell are the cell's). Other runs' processes, containers, images and folders are never
counted.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile
import uuid
from pathlib import Path
from typing import Any

from airflow_gpu_provider.host.workers import started_at

RUN = uuid.uuid4().hex
RUN_VARIABLE = "AIRFLOW_GPU_MATRIX_RUN"
RUN_LABEL = "airflow-gpu-provider-test.run"
FOLDER = Path(tempfile.mkdtemp(prefix="airflow-gpu-matrix-"))
TMP = FOLDER / "tmp"  # the workers' TMPDIR, and the pod-in-docker volumes' parent
PIDS = FOLDER / "pids"  # processes a scenario started that carry nothing of the run
TMP.mkdir()
PIDS.mkdir()
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
)
DEVICES = ("0", "1")
TMP_PREFIXES = ("airflow-gpu-netrc-", "airflow-gpu-ranks-", "pod-in-docker-", "airflow-gpu-ray-", "airflow-gpu-node-")
WORKERS: set[str] = set()  # the identities of this run's workers (host:pid:start)
REQUIREMENTS: set[str] = set()  # requirements hashes of images only this run builds (its own index's URL in them)
WORKER_LABELS = ("airflow-gpu-provider.worker", "airflow-gpu-provider.builder")


def add_worker(pid: int) -> None:
    """Record a worker of this run, by its identity (as :func:`~airflow_gpu_provider.host.workers.worker_identity`)."""
    WORKERS.add(f"{socket.gethostname()}:{pid}:{started_at(pid)}")


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _processes() -> set[str]:
    """The processes of this run that still run: those with its token, and those its scenarios named."""
    found = set()
    marker = f"{RUN_VARIABLE}={RUN}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0") and _running(int(entry.name)):
                    found.add(f"pid {entry.name}")
            except OSError:
                continue
    for named in PIDS.iterdir():
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


def _ours(labels: dict[str, str] | None) -> bool:
    labels = labels or {}
    if labels.get("airflow-gpu-provider.requirements-hash") in REQUIREMENTS:
        return True
    return labels.get(RUN_LABEL) == RUN or any(labels.get(label) in WORKERS for label in WORKER_LABELS)


def _containers(client: Any) -> set[str]:
    if client is None:
        return set()
    return {f"container {c['Id'][:12]}" for c in client.containers(all=True) if _ours(c.get("Labels"))}


def _images(client: Any) -> set[str]:
    """Images this run's builds left: untagged ones that no image is built on (a failed or killed build's)."""
    if client is None:
        return set()
    found = client.images(all=True, filters={"dangling": True, "label": "airflow-gpu-provider.derived"})
    return {f"image {i['Id'].split(':')[-1][:12]}" for i in found if _ours(i.get("Labels"))}


def _locks(state_dir: Path) -> set[str]:
    from airflow_gpu_provider.host.allocator import GpuAllocator
    from airflow_gpu_provider.host.inventory import Device

    allocator = GpuAllocator(state_dir / "locks")
    return {f"GPU {d}: {holder}" for d in DEVICES if (holder := allocator.holder_of(Device(d))) is not None}


def _temp_dirs(state_dir: Path) -> set[str]:
    found = {str(p) for folder in ("tasks", "docker-tasks", "venvs") for p in (state_dir / folder).glob("*")}
    return found | {str(p) for prefix in TMP_PREFIXES for p in TMP.glob(f"{prefix}*")}


def _ray() -> dict[str, set[str]]:
    """This run's jobs the Ray cluster still lists; the cluster's live actors and placement groups (the matrix's own
    cluster: what appeared during a cell is the cell's)."""
    address = os.environ.get("AIRFLOW_GPU_TEST_RAY_ADDRESS")
    if not address:
        return {"Ray jobs": set(), "Ray actors": set(), "placement groups": set()}
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors, list_placement_groups

    jobs = JobSubmissionClient(address).list_jobs()
    actors = list_actors(address=address, filters=[("state", "!=", "DEAD")], timeout=30)
    groups = list_placement_groups(address=address, filters=[("state", "!=", "REMOVED")], timeout=30)
    return {
        "Ray jobs": {
            f"job {j.submission_id} ({j.status})" for j in jobs if (j.metadata or {}).get("worker") in WORKERS
        },
        "Ray actors": {f"actor {a.actor_id[:12]} ({a.class_name})" for a in actors},
        "placement groups": {f"placement group {g.placement_group_id[:12]}" for g in groups},
    }


def snapshot(state_dir: Path) -> dict[str, set[str]]:
    """Everything of this run that counts as a leftover, as it is now."""
    client = _client()
    return {
        "processes": _processes(),
        "containers": _containers(client),
        "GPU locks": _locks(state_dir),
        "temp dirs": _temp_dirs(state_dir),
        "images": _images(client),
        **_ray(),
    }
