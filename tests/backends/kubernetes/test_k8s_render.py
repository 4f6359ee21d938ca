"""render_manifests(), the render CLI and golden manifests for the example DAGs.

Golden files hold the rendered Secret and pod with the parts that change on every call or machine replaced: the pod's
name (random), the Airflow version label, the shipped runtime (base64) and the task envelope in the Secret (decoded,
with the function's source and file path shortened, and the worker's host name replaced). Regenerate them with ``UPDATE_GOLDEN=1 pytest tests/backends/kubernetes``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import REPO
from helpers import dag_bag
from k8s_manifests import envelope_of, main_container, validate, with_secret

from airflow_gpu_provider.render import to_yaml

pytestmark = pytest.mark.smoke  # also on the oldest supported Airflow (its cncf-kubernetes provider)

GOLDEN = REPO / "tests" / "backends" / "kubernetes" / "golden"
CASES = {
    "gpu_training_demo.train.yaml": ("gpu_training_demo.py", "train", {}),
    "gpu_training_demo.train.gpu2.yaml": ("gpu_training_demo.py", "train", {"gpu_count": 2, "epochs": 5}),
    "example_kubernetes_gpu.fine_tune.yaml": ("example_kubernetes_gpu.py", "fine_tune", {}),
}


def _task(dag_file: str, task_id: str):
    bag = dag_bag(REPO / "dags" / dag_file)
    assert bag.import_errors == {}
    [dag] = bag.dags.values()
    return dag.get_task(task_id)


def normalize(obj: dict) -> dict:
    obj = json.loads(json.dumps(obj).replace(obj["metadata"]["name"].removesuffix("-envelope"), "<pod>"))
    obj["metadata"]["labels"]["airflow_version"] = "<airflow version>"
    if obj["kind"] == "Secret":  # the task's envelope
        envelope = envelope_of(obj)
        envelope["source"] = f"<source of {envelope['function']}()>"
        envelope["filename"] = os.path.relpath(envelope["filename"], REPO)
        envelope["first_line"] = "<line>"
        if (envelope.get("profile") or {}).get("host"):
            envelope["profile"]["host"] = "<the worker's host name>"
        obj["data"]["envelope"] = "<base64 of base64 of> " + json.dumps(envelope, sort_keys=True)
        return obj
    for variable in (
        v for c in [*obj["spec"].get("initContainers", []), *obj["spec"]["containers"]] for v in c.get("env") or []
    ):
        if variable["name"] == "AIRFLOW_GPU_BOOTSTRAP":
            variable["value"] = "<runtime.pyz (airflow_gpu_provider/runtime/), zlib + base64>"
    return obj


@pytest.mark.parametrize("golden", sorted(CASES))
def test_rendered_pods_match_the_golden_manifests(airflow_home, golden):
    dag_file, task_id, params = CASES[golden]
    objects = _task(dag_file, task_id).render_manifests(params=params)
    with_secret([validate(obj) for obj in objects])
    text = to_yaml([normalize(obj) for obj in objects])
    path = GOLDEN / golden
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{golden} changed; review and rerun with UPDATE_GOLDEN=1"


def test_golden_demo_params_reach_the_pod(airflow_home):
    secret, [pod] = with_secret(
        _task("gpu_training_demo.py", "train").render_manifests(params={"gpu_count": 2, "epochs": 5})
    )
    base = main_container(pod)
    assert base["resources"]["limits"]["nvidia.com/gpu"] == "2"
    envelope = envelope_of(secret)
    assert envelope["args"] == ["<XCom from make_dataset>"]
    assert envelope["kwargs"]["params"]["epochs"] == 5
    assert pod["metadata"]["labels"]["run_id"] == "render"


def test_render_does_not_change_the_dag_task(airflow_home):
    task = _task("gpu_training_demo.py", "train")
    before = (list(task.op_args), task.backend, dict(task.resource_overrides))
    task.render_manifests(params={"gpu_count": 3})
    assert (list(task.op_args), task.backend, dict(task.resource_overrides)) == before


def _cli(dag_file: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "airflow_gpu_provider.render", str(REPO / "dags" / dag_file), *args]
    return subprocess.run(command, capture_output=True, text=True, check=False, env=os.environ.copy())


def test_render_cli_prints_yaml_documents_only(airflow_home):
    done = _cli("example_kubernetes_gpu.py", "fine_tune", "--params", '{"epochs": 9}')
    assert done.returncode == 0, done.stderr
    _, [pod] = with_secret([validate(obj) for obj in yaml.safe_load_all(done.stdout)])
    assert pod["metadata"]["namespace"] == "ml"
    assert main_container(pod)["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_render_cli_reports_an_unknown_task(airflow_home):
    done = _cli("gpu_training_demo.py", "nope")
    assert done.returncode == 1
    assert "'nope': found 0 tasks" in done.stderr
    assert done.stdout == ""


def multiply(x: int) -> int:
    return x * 2


def test_render_inside_a_dag_definition(airflow_home):
    """render_manifests() while the DAG is still being defined: the pod operator must not join that DAG."""
    import datetime

    from airflow.sdk import DAG

    from airflow_gpu_provider import GpuStepOperator

    with DAG("render_in_block", schedule=None, start_date=datetime.datetime(2024, 1, 1)) as dag:
        task = GpuStepOperator(task_id="t", python_callable=multiply, op_args=[2], gpu_count=1, backend="kubernetes")
        _, [pod] = with_secret(task.render_manifests())
    assert pod["kind"] == "Pod"
    assert list(dag.task_dict) == ["t"]
