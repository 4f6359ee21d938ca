"""render_manifests(), the render CLI and golden manifests for the example DAGs.

Golden files hold the rendered pods with the parts that change on every call or machine replaced: the random pod
name suffix, the Airflow version label, the shipped runtime (base64) and the task envelope (decoded, with the
function's source and file path shortened, and the worker's host name replaced). Regenerate them with ``UPDATE_GOLDEN=1 pytest tests/backends/kubernetes``.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import REPO
from helpers import dag_bag
from k8s_manifests import env, main_container, validate

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


def normalize(pod: dict) -> dict:
    pod = json.loads(json.dumps(pod))
    pod["metadata"]["name"] = pod["metadata"]["name"].rsplit("-", 1)[0] + "-<random>"
    pod["metadata"]["labels"]["airflow_version"] = "<airflow version>"
    for variable in (
        v for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]] for v in c.get("env") or []
    ):
        if variable["name"] == "AIRFLOW_GPU_BOOTSTRAP":
            variable["value"] = "<runtime.pyz (airflow_gpu_provider/runtime/), zlib + base64>"
        if variable["name"] == "AIRFLOW_GPU_ENVELOPE":
            envelope = json.loads(base64.b64decode(variable["value"]))
            envelope["source"] = f"<source of {envelope['function']}()>"
            envelope["filename"] = os.path.relpath(envelope["filename"], REPO)
            envelope["first_line"] = "<line>"
            if (envelope.get("profile") or {}).get("host"):
                envelope["profile"]["host"] = "<the worker's host name>"
            variable["value"] = "<base64 of> " + json.dumps(envelope, sort_keys=True)
    return pod


@pytest.mark.parametrize("golden", sorted(CASES))
def test_rendered_pods_match_the_golden_manifests(airflow_home, golden):
    dag_file, task_id, params = CASES[golden]
    objects = _task(dag_file, task_id).render_manifests(params=params)
    for obj in objects:
        validate(obj)
    text = to_yaml([normalize(obj) for obj in objects])
    path = GOLDEN / golden
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{golden} changed; review and rerun with UPDATE_GOLDEN=1"


def test_golden_demo_params_reach_the_pod(airflow_home):
    [pod] = _task("gpu_training_demo.py", "train").render_manifests(params={"gpu_count": 2, "epochs": 5})
    base = main_container(pod)
    assert base["resources"]["limits"]["nvidia.com/gpu"] == "2"
    envelope = json.loads(base64.b64decode(env(base)["AIRFLOW_GPU_ENVELOPE"]))
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
    [pod] = list(yaml.safe_load_all(done.stdout))
    validate(pod)
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
        [pod] = task.render_manifests()
    assert pod["kind"] == "Pod"
    assert list(dag.task_dict) == ["t"]
