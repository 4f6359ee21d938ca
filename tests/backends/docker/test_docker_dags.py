"""Real DAG runs (dag.test) with backend="docker": XCom, timeouts, on_kill and the demo DAG."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from docker_fixtures import BASE_IMAGE, TEST_REPOSITORY, container_ids
from helpers import run_dag, task_states, xcom

from airflow_gpu_provider import GpuStepOperator, ImageSettings, gpu_task

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaks")]
IMAGE = ImageSettings(parent_image=BASE_IMAGE)


def run_inline_dag(dag, conf=None):
    """``dag.test()`` for a DAG defined in a test: it needs the DAG serialized first, as if a bundle held it."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    with create_session() as session:
        DagBundlesManager().sync_bundles_to_db(session=session)
    with create_session() as session:
        update_dag_parsing_results_in_db(
            "dags-folder", None, [LazyDeserializedDAG.from_dag(dag)], {}, None, set(), session=session
        )
    return run_dag(dag, conf)


def test_gpu_task_on_docker_pushes_its_return_value_to_xcom(airflow_home):
    from airflow.sdk import DAG

    with DAG("docker_xcom", schedule=None) as dag:

        @gpu_task(backend="docker", image=IMAGE, gpu_count=1, on_missing_gpu="cpu", memory="512Mi")
        def square(x: int, run_id: str | None = None) -> dict:
            import platform

            return {"square": x * x, "python": platform.python_version(), "run_id": run_id}

        square(12)

    dag_run = run_inline_dag(dag)
    assert task_states(dag_run) == {"square": "success"}
    value = xcom(dag_run, "square")
    assert value["square"] == 144
    assert value["python"].startswith("3.11")  # the container's Python (Debian bookworm), whatever the worker's
    assert value["run_id"] == dag_run.run_id


def test_execution_timeout_fails_the_task_and_removes_the_container(airflow_home):
    from airflow.sdk import DAG

    with DAG("docker_timeout", schedule=None) as dag:
        GpuStepOperator(
            task_id="sleepy",
            command=["python3", "-c", "import time; print('sleeping', flush=True); time.sleep(600)"],
            backend="docker",
            image=IMAGE,
            execution_timeout=timedelta(seconds=5),
        )
    started = time.monotonic()
    dag_run = run_inline_dag(dag)
    assert task_states(dag_run) == {"sleepy": "failed"}
    assert time.monotonic() - started < 60


def test_on_kill_stops_the_container(docker_client):
    operator = GpuStepOperator(
        task_id="killed",
        command=["python3", "-c", "import time; print('sleeping', flush=True); time.sleep(600)"],
        backend="docker",
        image=IMAGE,
        backend_options={"stop_timeout": 2},
    )
    ti = SimpleNamespace(dag_id="docker_on_kill", task_id="killed", run_id="manual", try_number=1, map_index=-1)
    errors: list[BaseException] = []

    def execute() -> None:
        try:
            operator.execute({"ti": ti})
        except BaseException as err:
            errors.append(err)

    before = container_ids(docker_client)
    thread = threading.Thread(target=execute)
    thread.start()
    deadline = time.monotonic() + 30
    while not (container_ids(docker_client) - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    assert container_ids(docker_client) - before
    operator.on_kill()
    thread.join(30)
    assert not thread.is_alive()
    assert errors and "killed" in str(errors[0])


@pytest.mark.slow
def test_demo_dag_trains_in_docker_with_cpu_fallback(airflow_home, docker_client, monkeypatch, task_log):
    """The example DAG, unchanged, with backend=docker on a host without the NVIDIA runtime.

    Its train step imports torch, which the Debian base image lacks: the test first builds a derived image
    (base + the CPU torch wheel from /opt/wheels, as an air-gapped wheel dir) and makes it ``[gpu]
    default_parent_image``, standing in for the default CUDA PyTorch image, which cannot be pulled here.
    """
    from pathlib import Path

    from airflow.dag_processing.dagbag import DagBag
    REPO = Path(__file__).resolve().parents[3]

    from airflow_gpu_provider.images.dockerfile import BuildOptions, derived_image_spec
    from airflow_gpu_provider.images.engine import ensure_derived_image

    wheels = Path("/opt/wheels")
    if not any(wheels.glob("torch-*.whl")):
        pytest.skip("no torch wheel in /opt/wheels to build the stand-in PyTorch image")
    torch_image = ImageSettings(parent_image=BASE_IMAGE, requirements=["torch"], find_links=[str(wheels)])
    spec = derived_image_spec(BASE_IMAGE, torch_image, BuildOptions(repository=TEST_REPOSITORY), uv_binary=None)
    reference, _ = ensure_derived_image(
        docker_client,
        spec,
        docker_client.inspect_image(BASE_IMAGE)["Id"],
        lock_dir=str(airflow_home / "locks"),
        push=False,
        log=task_log[0],
    )
    monkeypatch.setenv("AIRFLOW__GPU__DEFAULT_PARENT_IMAGE", reference)

    bag = DagBag(dag_folder=str(REPO / "dags" / "gpu_training_demo.py"))
    dag_run = run_dag(
        bag.get_dag("gpu_training_demo"),
        conf={"epochs": 3, "gpu_count": 1, "backend": "docker", "on_missing_gpu": "cpu"},
    )
    assert task_states(dag_run) == {"make_dataset": "success", "train": "success", "report": "success"}
    metrics = xcom(dag_run, "train")
    assert metrics["epochs"] == 3
    assert metrics["device"] == "cpu"
    assert metrics["final_loss"] < metrics["initial_loss"]
