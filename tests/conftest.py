"""Shared test set-up: a real Airflow home on SQLite, migrated once per session.

The environment is set before anything imports Airflow, which reads its configuration at import time.

The suite's outcome must not depend on the host's GPUs: the provider's inventory is pinned to none
(``AIRFLOW__GPU__DEVICES=none``; a test that needs GPUs lists fake ids) and torch in the test processes sees none
(``CUDA_VISIBLE_DEVICES=""``; the provider sets its own value for the tasks it starts). Tests marked ``gpu`` check
the real GPU paths; they lift those pins themselves, and skip (saying why) where no NVIDIA GPU is present.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu_support import REQUIRE_GPU, nvidia_gpus

REPO = Path(__file__).resolve().parents[1]
# Docker engine fixtures (skip, or fail in CI, without one), the second engine with the authorization plugin;
# the failure matrix's report
pytest_plugins = (
    "backends.docker.docker_fixtures",
    "backends.docker.authz_engine",
    "backends.docker.user_engines",  # a rootless Docker engine and Podman, of the worker's own user
    "backends.docker.engine_user_session",  # ... and the session of that user that runs a root session's tests there
    "backends.kubernetes.api_calls",  # every Kubernetes API call, recorded for the RBAC check
    "backends.kubernetes.cluster_answers",
    "backends.ray.ray_cluster",
    "backends.slurm.slurm_cluster",
    "reliability.report",
)
_HOME = Path(tempfile.mkdtemp(prefix="airflow-gpu-tests-"))
# Worker files that derived-image builds may read ([gpu_policy] allowed_build_paths): readable by every local user, as the
# policy wants (pytest's tmp_path is private to its user), and the wheels of /opt/wheels.
BUILD_INPUTS = Path(tempfile.mkdtemp(prefix="airflow-gpu-build-inputs-"))
BUILD_INPUTS.chmod(0o755)
atexit.register(shutil.rmtree, BUILD_INPUTS, ignore_errors=True)
os.environ.update(
    {
        "AIRFLOW_HOME": str(_HOME),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        # dag.test() needs a DAG in a bundle: the examples, and the test DAGs in tests/dags
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(
            [
                {
                    "name": name,
                    "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                    "kwargs": {"path": str(path)},
                }
                for name, path in (("dags-folder", REPO / "dags"), ("test-dags", REPO / "tests" / "dags"))
            ]
        ),
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        # re-serialise a DAG on every sync: tests change config that DAG parsing reads
        "AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL": "0",
        "AIRFLOW__GPU__STATE_DIR": str(_HOME / "gpu-state"),
        # this session's name in its containers' labels: the engine's authorization plugin (authz_engine.py) and the
        # orphan reapers of other sessions on the same engine tell its containers by it
        "AIRFLOW__GPU_POLICY__DEPLOYMENT": f"tests-{_HOME.name.rsplit('-', 1)[-1]}",
        "AIRFLOW__GPU__DEVICES": "none",
        "CUDA_VISIBLE_DEVICES": "",  # torch sees no GPU unless a test (marked gpu) or the provider says otherwise
        "AIRFLOW__GPU__POLL_INTERVAL": "0.2",
        "AIRFLOW__GPU_POLICY__ALLOWED_BUILD_PATHS": f"{BUILD_INPUTS},/opt/wheels",
        # what the tests' pods name of the cluster (rule P3), as a deployment's admin lists it
        "AIRFLOW__GPU_POLICY__ALLOWED_OBJECTS": "namespace=ml, namespace=ml-training, service_account=trainer, "
        "runtime_class=nvidia, priority_class=gpu-high, priority_class=batch, kueue_queue=team-a, "
        "kueue_priority_class=gpu-high, partition=low, partition=quick",
    }
)


# Hypothesis: every property test runs the profile's number of examples, fixed (derandomised) so that a run is
# repeatable; `make fuzz` (HYPOTHESIS_PROFILE=deep) runs the deep search the fuzz tests were written for.
# The fuzz tests' budgets: fuzz_cases() in helpers.py. (The oldest-Airflow smoke venv has no Hypothesis.)
try:
    from hypothesis import settings
except ImportError:  # pragma: no cover - make smoke-oldest
    pass
else:
    settings.register_profile("default", max_examples=100, derandomize=True, database=None, deadline=None)
    settings.register_profile("deep", max_examples=1000, derandomize=True, database=None, deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# Lanes: every test gets one of the markers unit, docker, cluster, reliability (`-m unit` selects the fast lane). Under
# pytest-xdist (`make test`: `-n 2 --dist loadgroup`) the docker lane runs on one worker, one test at a time, as does
# the failure matrix, and so does each cluster a session starts once: tests that count what a dead worker left on
# the engine, or stop what it left, never see another lane's.
SHARED = {"ray_cluster_address": "ray-cluster", "slurm_session": "slurm-cluster"}  # fixture -> its tests' group
CLUSTER_PATHS = ("tests/executors/", "tests/backends/ray/", "tests/backends/slurm/", "tests/test_local_airflow.py")
# Modules whose tests share one costly set-up (a module-scoped cluster, a run kept per process): all on one worker, so
# that it happens once. The two clusters' modules have a Docker test (a deferred task's container, whose worker has
# exited, which the docker lane's leak counts would see and remove): the docker lane's worker.
MODULE_GROUPS = {
    "tests/test_local_airflow.py": "docker",
    "tests/executors/test_deferred_scheduler.py": "docker",
    "tests/telemetry/test_metrics.py": "failing-tries",  # tests/failing_tries.py: one run per test process
    "tests/escalation/test_retry_policy.py": "failing-tries",
}


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The lane marker of each test, and the xdist group of the lanes that run one test at a time."""
    xdist = config.pluginmanager.hasplugin("xdist")  # absent in make smoke-oldest's venv
    for item in items:
        path = Path(str(item.path)).relative_to(REPO).as_posix()
        fixtures = set(getattr(item, "fixturenames", ()))
        group = next((SHARED[name] for name in sorted(fixtures & SHARED.keys())), None)
        if path.startswith("tests/reliability/"):
            lane = group = "reliability"
        elif path.startswith(CLUSTER_PATHS) or group is not None:
            lane = "cluster"
        elif item.get_closest_marker("docker") is not None or "docker_client" in fixtures:
            lane = group = "docker"
        else:
            lane = "unit"
            if path.startswith("tests/backends/kubernetes/"):  # test_rbac.py reads what this worker's tests recorded
                group = "kubernetes"
        group = MODULE_GROUPS.get(path, group)
        item.add_marker(getattr(pytest.mark, lane))
        if group is not None and xdist:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def real_gpus(monkeypatch: pytest.MonkeyPatch) -> tuple[str, ...]:
    """For ``gpu`` tests: the provider's inventory from NVML in this process too; the host's GPU UUIDs."""
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "auto")
    return nvidia_gpus()[0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``gpu`` skip without an NVIDIA GPU (fail instead with ``AIRFLOW_GPU_REQUIRE_GPU=1``)."""
    if item.get_closest_marker("gpu") is None:
        return
    gpus, why = nvidia_gpus()
    if gpus:
        return
    reason = f"needs an NVIDIA GPU: {why}"
    if REQUIRE_GPU:
        pytest.fail(f"AIRFLOW_GPU_REQUIRE_GPU=1 but this test {reason}", pytrace=False)
    pytest.skip(f"{reason} (it runs on GPU machines; AIRFLOW_GPU_REQUIRE_GPU=1 makes this an error)")


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """A migrated Airflow metadata DB (SQLite) in a temporary AIRFLOW_HOME."""
    marker = _HOME / ".migrated"
    if not marker.exists():
        subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True, env=os.environ.copy()
        )
        marker.touch()
    return _HOME


@pytest.fixture
def build_inputs() -> Iterator[Path]:
    """A fresh folder beneath ``[gpu_policy] allowed_build_paths``, readable by every local user: wheels, CA bundles."""
    folder = Path(tempfile.mkdtemp(dir=BUILD_INPUTS))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ``[gpu] state_dir`` for one test."""
    monkeypatch.setenv("AIRFLOW__GPU__STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"
