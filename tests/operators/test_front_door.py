"""One front door: every argument a GPU task takes is declared on its operator and settled once, at parse.

``.partial()`` and ``.expand()`` take each argument (Airflow checks them against the operator's declared ones), a
plain, mapped or decorated task is settled once (``GpuStepOperator.settle``), and a deprecated argument warns at the
DAG line, in Airflow's own view of the file (the DagBag's warnings).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk import DAG
from conftest import REPO
from helpers import load_dag, mapped_xcoms, run_dag

from airflow_gpu_provider import AccelerateOperator, GpuStepOperator, gpu_task
from airflow_gpu_provider.operators.spec import TaskSpec

pytestmark = pytest.mark.usefixtures("airflow_home")
DAGS = REPO / "tests" / "dags" / "front_door_dags.py"


def work(x: int) -> int:
    return x


def test_every_argument_goes_through_partial_and_expand(tmp_path, monkeypatch):
    """What raised ``TypeError`` in ``.partial()`` / ``.expand()`` (checkpoint, deferrable, durable...) runs."""
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", str(tmp_path))
    dag = load_dag(DAGS, "front_door_mapped")
    spec = dag.get_task("partial").partial_kwargs["task_spec"]
    assert (spec.deferrable, spec.durable, spec.wait_timeout) == (False, False, 60.0)
    decorated = dag.get_task("checkpoint_folder").partial_kwargs["task_spec"]
    assert (decorated.durable, decorated.resume) == (False, True)
    dag_run = run_dag(dag, conf={"root": str(tmp_path)})
    for task_id, roots in (
        ("partial", ["partial"] * 2),
        ("expanded", ["a", "b"]),
        ("checkpoint_folder", ["decorated"] * 2),
    ):
        values = mapped_xcoms(dag_run, task_id)
        assert sorted(values) == [0, 1], (task_id, values)
        for index, root in enumerate(roots):
            folder = values[index]["folder"]  # the try's folder, under the root this map index was given
            assert folder.startswith(f"{tmp_path}/{root}/front_door_mapped/"), (task_id, index, folder)
            assert folder.endswith(f"~map{index}"), folder


def test_a_mapped_accelerate_task_takes_launch_options_by_name():
    with DAG("front_door_accelerate", schedule=None):
        mapped = AccelerateOperator.partial(
            task_id="launch", python_callable=work, num_processes=2, num_cpu_threads_per_process=2, durable=False
        ).expand(op_args=[[1], [2]])
    spec = mapped.partial_kwargs["task_spec"]
    assert spec.launch == {"num_processes": 2, "num_cpu_threads_per_process": 2} and not spec.durable


def test_reattach_in_partial_is_durable_with_a_warning():
    with DAG("front_door_reattach", schedule=None), pytest.warns(AirflowProviderDeprecationWarning, match="reattach"):
        mapped = GpuStepOperator.partial(task_id="t", command=["true"], reattach=False).expand(environment=[{}])
    assert mapped.partial_kwargs["task_spec"].durable is False


def test_a_task_is_settled_once(monkeypatch):
    """The decorator settles; the call that makes the operator, and a mapped copy, take the settled task."""
    settled: list[str] = []
    settle = TaskSpec.settle.__func__  # type: ignore[attr-defined]

    def counted(cls, owner, arguments, **kwargs):
        settled.append(owner)
        return settle(cls, owner, arguments, **kwargs)

    monkeypatch.setattr(TaskSpec, "settle", classmethod(counted))
    with DAG("front_door_once", schedule=None):
        train = gpu_task(gpu_count=0, checkpoint=False, deferrable=False)(work)
        train(1)
        train(2)
        train.expand(x=[1, 2])
        GpuStepOperator(task_id="classic", command=["true"], memory="1Gi", wait_timeout=5)
    assert settled == ["@task.gpu('work')", "GpuStepOperator('classic')"]


def test_a_deprecated_argument_warns_at_its_dag_line_in_the_dagbag(tmp_path):
    """As the DAG processor parses the file (a DagBag in a process of its own, Airflow's warning filters): the
    warning is the file's, at the line of the task (the UI lists it under the DAG's warnings)."""
    dag_file = tmp_path / "deprecated_reattach.py"
    dag_file.write_text(
        textwrap.dedent(
            """
            import pendulum
            from airflow.sdk import dag, task


            @dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1))
            def deprecated_reattach():
                @task.gpu(backend="docker", reattach=False)  # HERE
                def train():
                    return 1

                train()


            deprecated_reattach()
            """
        )
    )
    line = next(number for number, text in enumerate(dag_file.read_text().splitlines(), 1) if "# HERE" in text)
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from helpers import dag_bag;"
        f"bag = dag_bag({str(dag_file)!r});"
        "print(json.dumps([bag.import_errors, bag.captured_warnings]))"
    )
    tests = str(REPO / "tests")
    out = subprocess.run([sys.executable, "-c", code, tests], capture_output=True, text=True, check=True).stdout
    errors, warnings = json.loads(out.strip().splitlines()[-1])
    assert errors == {}
    (warning,) = warnings[str(dag_file)]
    assert warning == (
        f"{dag_file}:{line}: airflow.exceptions.AirflowProviderDeprecationWarning: @task.gpu('train'): "
        "reattach=False is deprecated: write durable=False, Airflow's name for it"
    )


# ------------------------------------------------------------------ mistakes that name the fix (issue 36)
def _error(build) -> str:
    from airflow_gpu_provider.exceptions import InvalidSettingError

    with pytest.raises(InvalidSettingError) as raised, DAG("front_door_mistakes", schedule=None):
        build()
    return str(raised.value)


def test_a_task_argument_given_to_a_decorated_partial_or_expand_names_override():
    train = gpu_task(gpu_count=0)(work)
    partial = _error(lambda: train.partial(checkpoint="/tmp/ck").expand(x=[1, 2]))
    assert "checkpoint is an argument of the task, not of work()" in partial
    assert "Accepted: work.override(checkpoint=...).partial(...)" in partial
    expand = _error(lambda: train.partial().expand(checkpoint=["/tmp/a", "/tmp/b"]))
    assert "work.override(checkpoint=...).expand(...) for every map index" in expand
    assert "GpuStepOperator.partial(task_id=..., python_callable=work).expand(checkpoint=[...])" in expand
    retries = _error(lambda: train.partial(retries=2).expand(x=[1]))  # BaseOperator's too
    assert "work.override(retries=...)" in retries


def test_another_tools_name_of_a_setting_names_the_providers():
    assert "Did you mean 'gpu_count' for 'gpus'?" in _error(lambda: gpu_task(gpus=2)(work)(1))
    assert "Did you mean 'gpu_count' for 'num_gpus'?" in _error(
        lambda: GpuStepOperator(task_id="t", command=["true"], num_gpus=2)
    )
    assert "Did you mean 'environment' for 'env'?" in _error(
        lambda: GpuStepOperator.partial(task_id="t", command=["true"], env={}).expand(op_args=[[1]])
    )


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("nvidia-tesla-a100", "A100"),  # GKE's cloud.google.com/gke-accelerator
        ("nvidia-h100-80gb", "H100-80GB"),
        ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),  # NVIDIA's nvidia.com/gpu.product
        ("Tesla-T4", "T4"),
        ("Tesla-V100-SXM2-16GB", "V100"),
        ("AMD-Instinct-MI300X", "MI300X"),
    ],
)
def test_a_clouds_name_of_a_model_names_the_model(name, model):
    message = _error(lambda: gpu_task(gpu_count=1, accelerator=name)(work)(1))
    assert f"accelerator={name!r} is invalid: a cloud's or a node label's name of the {model} " in message
    assert message.endswith(f"Accepted: accelerator={model!r}")


def test_environment_and_the_payload_are_settled_at_partial():
    """Issue 37: ``.partial()`` refused neither (they failed on the worker, or never)."""
    env = _error(lambda: GpuStepOperator.partial(task_id="e", command=["true"], environment={"A": 1}))
    assert "GpuStepOperator('e'): environment['A']=1 is invalid: values must be strings" in env
    both = _error(lambda: GpuStepOperator.partial(task_id="p", python_callable=work, command=["true"]))
    assert (
        "GpuStepOperator('p'): python_callable/command=['true'] is invalid: give exactly one of them, not both" in both
    )
    script = _error(lambda: AccelerateOperator.partial(task_id="a", script="train.py", python_callable=work))
    assert "AccelerateOperator('a'): script/python_callable=" in script and "give exactly one of them" in script
    neither = _error(lambda: AccelerateOperator(task_id="n"))
    assert "AccelerateOperator('n'): script/python_callable=None is invalid: give exactly one of them" in neither


def test_every_entry_names_the_task_alike():
    """One builder of a task's name (``owner_name``): the operator, ``.partial()``, the decorator, ``.override()``."""
    bad = {"memory": "16XB"}
    assert "GpuStepOperator('a'): " in _error(lambda: GpuStepOperator(task_id="a", command=["true"], **bad))
    assert "GpuStepOperator('b'): " in _error(lambda: GpuStepOperator.partial(task_id="b", command=["true"], **bad))
    assert "@task.gpu('work'): " in _error(lambda: gpu_task(**bad)(work))
    assert "@task.gpu('c'): " in _error(lambda: gpu_task(work).override(task_id="c", **bad))
