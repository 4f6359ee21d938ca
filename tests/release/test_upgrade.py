"""An upgrade in place, for real: the previous release starts a deferred and a durable Docker task, its worker is
killed and its triggerer stopped midway, the provider is upgraded in the same venv, and this release finishes both
(the trigger the previous release stored, the container it recorded); then a worker of each release side by side.

**The previous release is commit** :data:`PREVIOUS` (``b5efba0``, what had landed when the 0.2.0 round began, still
versioned 0.1.0). The ``[0.1.0]`` cut (``f9503ac``) has neither deferred Docker tasks nor durable ones: nothing of
them to carry across an upgrade. ``b5efba0`` is what pilots ran with both, and what 0.2.0 must upgrade (CHANGELOG.md,
"Upgrading to 0.2.0"). CI clones with history; a clone without that commit fails here, saying so.

Cheap as it can be: the previous wheel built from that commit (``git archive``, ``uv build``), one venv of the
current venv's packages from uv's cache (``--no-deps``, without torch, Ray and the dev tools: a Docker worker
needs none), one Airflow (SQLite, Redis, Celery) whose processes run from that venv, one run of each DAG, on the
host's engine (without the authorization plugin, which refuses the previous release's calls: an engine with the
plugin is upgraded with it, CHANGELOG.md says how). The docker lane runs one test at a time (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "executors"))
from cluster import Cluster, let_go, wait_for_port

pytest.importorskip("airflow.providers.celery", reason="the Celery provider is not installed (the dev extra has it)")
pytestmark = [pytest.mark.upgrade, pytest.mark.slow, pytest.mark.docker]
PREVIOUS = "b5efba0"  # the previous release: see the module's docstring and CHANGELOG.md
UV = Path(sys.executable).with_name("uv")
#: What a Docker worker does not need of the test venv (and what uv's cache may lack: pip, uv)
LEFT_OUT = (
    "torch",
    "accelerate",
    "ray",
    "playwright",
    "mypy",
    "ruff",
    "hypothesis",
    "pytest",
    "pip",
    "setuptools",
    "uv",
)


def previous_commit() -> str:
    """The full id of the previous release's commit; fail (never skip) when this clone lacks it."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{PREVIOUS}^{{commit}}"],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(
            f"the previous release's commit {PREVIOUS} is not in this clone: the upgrade test builds that release's wheel "
            "from it. Clone with history (git fetch --unshallow, or a full clone), as CI does.",
            pytrace=False,
        )
    return done.stdout.strip()


def run(*argv: str | Path, **kwargs: object) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{' '.join(map(str, argv))}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return str(done.stdout)


def wheel(source: Path, out: Path) -> Path:
    """The provider's wheel built from ``source`` (uv build, its build backend from uv's cache)."""
    run(UV, "build", "--wheel", "--quiet", "--out-dir", out, source)
    (built,) = out.glob("airflow_gpu_provider-*.whl")
    return built


def venv_with(provider: Path, folder: Path) -> Path:
    """A venv of this venv's packages (but :data:`LEFT_OUT`) and ``provider``, all ``--no-deps``; its python."""
    frozen = run(UV, "pip", "freeze", "--python", sys.executable, "--exclude-editable").splitlines()
    wanted = [line for line in frozen if line.split("==")[0].lower() not in LEFT_OUT]
    folder.parent.mkdir(parents=True, exist_ok=True)
    (folder.parent / "requirements.txt").write_text("\n".join(wanted) + "\n")
    run(UV, "venv", "--quiet", "--python", sys.executable, folder)
    python = folder / "bin" / "python"
    install = [
        UV,
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--python",
        python,
        "-r",
        folder.parent / "requirements.txt",
    ]
    with contextlib.suppress(AssertionError):
        run(*install, "--offline", provider)  # uv's warm cache: seconds
        return python
    run(*install, provider)  # a cold cache: from the index
    return python


def version(python: Path) -> str:
    code = "import importlib.metadata as m; print(m.version('airflow-gpu-provider'))"
    return run(python, "-c", code, cwd="/").strip()


def airflow(python: Path, *args: str) -> list[str]:
    return [str(python), "-m", "airflow", *args]


def start_fleet(cluster: Cluster, python: Path, suffix: str, workers: dict[str, tuple[Path, str]]) -> None:
    """The API server, DAG processor, scheduler and triggerer of one release (names ``<component>-<suffix>``), and
    ``workers`` (name: their python, their queues), all starting side by side; until the API server listens."""
    cluster.start(
        f"api-server-{suffix}", airflow(python, "api-server", "--port", str(cluster.api_port), "--host", "127.0.0.1")
    )
    for component in ("dag-processor", "scheduler", "triggerer"):
        cluster.start(f"{component}-{suffix}", airflow(python, component))
    for name, (worker_python, queues) in workers.items():
        worker(cluster, worker_python, name, queues)
    wait_for_port(cluster.api_port, 180, cluster)


def worker(cluster: Cluster, python: Path, name: str, queues: str = "default") -> None:
    command = ["celery", "worker", "--concurrency", "2", "--skip-serve-logs", "--queues", queues]
    cluster.start(name, airflow(python, *command, "--celery-hostname", f"{name}@%h"))


def stop(cluster: Cluster, names: list[str], sig: int = signal.SIGTERM) -> None:
    """Stop processes of the cluster (each its whole group), together: SIGTERM waits for them, SIGKILL is a crash."""
    processes = [cluster.processes.pop(name) for name in names]
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
    deadline = time.monotonic() + 60
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextlib.contextmanager
def airflow_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A CeleryExecutor Airflow (no process yet) on tests/release/upgrade_dags.py; everything stopped after."""
    dags, home = tmp_path / "dags", tmp_path / "home"
    dags.mkdir()
    home.mkdir()
    shutil.copy(Path(__file__).with_name("upgrade_dags.py"), dags)
    root = tmp_path / "checkpoints"  # beneath the session's base: a root the second engine's plugin allows
    root.mkdir(mode=0o700)
    cluster = Cluster(
        home,
        dags,
        {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__GPU__DEVICES": "none",
            "AIRFLOW__GPU__ALLOWED_CHECKPOINT_ROOTS": str(root),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "10",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "5",  # a stopped triggerer's triggers move soon
            "PYTHONSAFEPATH": "1",  # the working directory (this checkout) never shadows the venv's provider
        },
    )
    cluster.env.pop("PYTHONPATH", None)
    # the deployment is named as the previous release named it (its digest): [gpu_policy] deployment is new in 0.2.0,
    # and an upgrade that sets it at once leaves the previous release's durable containers to another deployment
    cluster.env.pop("AIRFLOW__GPU_POLICY__DEPLOYMENT", None)
    cluster.root = root  # type: ignore[attr-defined]
    try:
        broker = cluster.start_redis()
        cluster.env["AIRFLOW__CELERY__BROKER_URL"] = f"{broker}/0"
        cluster.env["AIRFLOW__CELERY__RESULT_BACKEND"] = f"redis://{broker.split('://')[1]}/1"
        cluster.migrate()  # the same Airflow in both releases: a fresh DB of this process, if it has one
        yield cluster
    finally:
        leftovers = cluster.stop()
        assert leftovers == [], leftovers


def try_log(cluster: Cluster, dag_id: str, try_number: int, task_id: str) -> str:
    """The log of one try of ``task_id``, the worker's and the triggerers' files, or "" before it exists."""
    logs = sorted((cluster.home / "logs").glob(f"dag_id={dag_id}/**/task_id={task_id}/attempt={try_number}.log*"))
    return "\n".join(path.read_text(errors="replace") for path in logs)


def states(cluster: Cluster, dag_id: str, run_id: str) -> dict[str, str]:
    return {task: ti["state"] for task, ti in cluster.task_instances(dag_id, run_id).items()}


def followed(cluster: Cluster) -> str:
    """The log of the deferred task's trigger in this release's triggerer (the second), or "" before it exists."""
    triggerers = cluster.query("SELECT id FROM job WHERE job_type = 'TriggererJob' ORDER BY id")
    if len(triggerers) < 2:
        return ""
    newest = triggerers[-1][0]
    pattern = f"dag_id=upgrade_story/**/task_id=deferred/attempt=1.log.trigger.{newest}.log"
    return "\n".join(path.read_text(errors="replace") for path in (cluster.home / "logs").glob(pattern))


def test_the_previous_releases_deferred_and_durable_tasks_are_finished_by_this_one(tmp_path, docker_client):
    commit = previous_commit()
    source = tmp_path / "previous"
    source.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    python = venv_with(wheel(source, tmp_path / "previous-dist"), tmp_path / "venv" / "fleet")
    new_wheel = wheel(REPO, tmp_path / "this-dist")
    this = importlib.metadata.version("airflow-gpu-provider")
    assert version(python) != this, "the previous release must be another version than this one"

    with airflow_cluster(tmp_path) as cluster:
        root = cluster.root  # type: ignore[attr-defined]
        # --- the previous release: its fleet starts both tasks
        start_fleet(cluster, python, "previous", {"worker-previous": (python, "default")})
        cluster.wait_for_dag("upgrade_story")
        cluster.trigger("upgrade_story", "r1", {"root": str(root)})
        cluster._wait(lambda: states(cluster, "upgrade_story", "r1").get("deferred") == "deferred", 240, "the deferral")
        cluster._wait(lambda: "Started container" in try_log(cluster, "upgrade_story", 1, "durable"), 240, "durable")
        trigger = cluster.query("SELECT classpath FROM trigger")
        assert trigger == [("airflow_gpu_provider.backends.docker.trigger.DockerContainerTrigger",)], trigger
        containers = {
            c["Labels"]["airflow-gpu-provider.task_id"]: c["Id"][:12]
            for c in docker_client.containers(filters={"label": "airflow-gpu-provider.run_id=r1"})
        }
        assert set(containers) == {"deferred", "durable"}, containers

        # --- the upgrade: the worker dies (its whole group, as an OOM kill ends it), the rest stops, the provider
        # is replaced in the same venv; a copy of the previous release is kept for the mixed fleet
        import psutil

        tree = psutil.Process(cluster.processes["worker-previous"].pid).children(recursive=True)
        stop(cluster, ["worker-previous"], signal.SIGKILL)
        orphans = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # the task process
        stop(cluster, [name for name in cluster.processes if name.endswith("-previous")])
        previous = tmp_path / "venv" / "previous"
        run("cp", "-al", python.parents[1], previous)  # hard links: the upgrade writes new files, not these
        run(UV, "pip", "install", "--quiet", "--offline", "--no-deps", "--python", python, new_wheel)
        assert version(python) == this

        # --- this release finishes both: the stored trigger, the recorded container
        # and the mixed fleet's worker of the previous release (below), on a queue of its own that nothing of r1 is on
        start_fleet(
            cluster,
            python,
            "this",
            {"worker-this": (python, "default,this"), "worker-previous-2": (previous / "bin" / "python", "previous")},
        )
        # this release has taken both containers over (or the run ended without it): their functions may end now
        cluster._wait(
            lambda: (
                ("Reattached to" in try_log(cluster, "upgrade_story", 2, "durable") and followed(cluster))
                or states(cluster, "upgrade_story", "r1").get("deferred") in ("success", "failed")
            ),
            300,
            "this release to take both containers over",
        )
        let_go(root)
        state = cluster.wait_for_run("upgrade_story", "r1", timeout=300)
        tis = cluster.task_instances("upgrade_story", "r1")
        assert state == "success", f"{tis}\n{cluster.logs()}"
        deferred, durable = (
            try_log(cluster, "upgrade_story", 1, "deferred"),
            try_log(cluster, "upgrade_story", 2, "durable"),
        )
        assert "done after 1 run(s)" in deferred, deferred[-3000:]  # the previous release's container, followed
        assert cluster.xcom("upgrade_story", "r1", "deferred") == {"runs": 1}
        assert f"Reattached to container {containers['durable']}" in durable, durable[-3000:]
        assert cluster.xcom("upgrade_story", "r1", "durable") == {"runs": 1}  # one process ran the function
        assert f"Watching container {containers['deferred']}" in followed(cluster)  # this release's triggerer
        assert "done after 1 run(s)" in followed(cluster)

        # --- a mixed fleet: a worker of the previous release beside this release's, each on its own queue
        cluster.trigger("upgrade_mixed_fleet", "r2", {"root": str(root)})
        state = cluster.wait_for_run("upgrade_mixed_fleet", "r2", timeout=300)
        tis = cluster.task_instances("upgrade_mixed_fleet", "r2")
        assert state == "success", f"{tis}\n{cluster.logs()}"
        assert {task: ti["queue"] for task, ti in tis.items()} == {
            "deferred_on_previous": "previous", "durable_on_previous": "previous",
            "deferred_on_this": "this", "durable_on_this": "this",
        }  # fmt: skip
        _, alive = psutil.wait_procs(orphans, timeout=120)  # the killed worker's task process ends with its container
        assert alive == [], alive
    left = docker_client.containers(all=True, filters={"label": "airflow-gpu-provider.run_id"})
    assert left == [], [(c["Id"][:12], c["Labels"]) for c in left]
