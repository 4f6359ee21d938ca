"""Parse errors point at the DAG line: Airflow's own import errors name the DAG file, the line and the task.

Each DAG file below has one mistake on the line marked ``# HERE``; ``airflow dags list-import-errors --local`` (a real
DagBag, in a subprocess, with Airflow's default traceback depth) must show that file and line, and the task as its
author wrote it, and the traceback it keeps must end at that line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_gpu_provider import GpuStepOperator, ResourceSettings
from airflow_gpu_provider.exceptions import InvalidSettingError

HEADER = """\
import pendulum
from airflow.sdk import DAG, dag, task
from airflow_gpu_provider import AccelerateOperator, GpuStepOperator, ImageSettings, ResourceSettings

START = pendulum.datetime(2024, 1, 1)
"""

#: file name -> (the DAG's body, the task as the error must name it; None: no task, module-level settings)
CASES: dict[str, tuple[str, str | None]] = {
    "resources_in_operator.py": (
        """
        with DAG("resources_in_operator", schedule=None, start_date=START):
            GpuStepOperator(
                task_id="prepare",
                command=["true"],
                resources=ResourceSettings(memory="16XB"),  # HERE
            )
        """,
        "GpuStepOperator('prepare')",
    ),
    "resources_in_decorator.py": (
        """
        @dag(schedule=None, start_date=START)
        def resources_in_decorator():
            @task.gpu(resources=ResourceSettings(gpu_count=-1))  # HERE
            def train():
                return 1

            train()

        resources_in_decorator()
        """,
        "@task.gpu('train')",
    ),
    "accelerator_typo.py": (
        """
        @dag(schedule=None, start_date=START)
        def accelerator_typo():
            @task.gpu(accelerator="A1000", on_missing_gpu="cpu")  # HERE
            def train():
                return 1

            train()

        accelerator_typo()
        """,
        "@task.gpu('train')",
    ),
    "decorator_argument.py": (
        """
        @dag(schedule=None, start_date=START)
        def decorator_argument():
            @task.gpu(task_id="fit", accelerate="yes")  # HERE
            def train():
                return 1

            train()

        decorator_argument()
        """,
        "@task.gpu('fit')",
    ),
    "accelerate_option.py": (
        """
        with DAG("accelerate_option", schedule=None, start_date=START):
            AccelerateOperator(task_id="launch", script="train.py", num_procesess=2)  # HERE
        """,
        "AccelerateOperator('launch')",
    ),
    "policy_refusal.py": (
        """
        with DAG("policy_refusal", schedule=None, start_date=START):
            GpuStepOperator(  # HERE
                task_id="privileged",
                command=["true"],
                backend="docker",
                backend_options={"cap_add": ["SYS_ADMIN"]},
            )
        """,
        "GpuStepOperator('privileged')",
    ),
    "call_arguments.py": (
        """
        @dag(schedule=None, start_date=START)
        def call_arguments():
            @task.gpu
            def train(epochs: int):
                return epochs

            train(epochs={1, 2})  # HERE: a set cannot travel as JSON

        call_arguments()
        """,
        "@task.gpu('train')",
    ),
    "mapped.py": (
        """
        with DAG("mapped", schedule=None, start_date=START):
            GpuStepOperator.partial(task_id="sweep", command=["true"], gpu_count="two").expand(  # HERE
                environment=[{"A": "1"}]
            )
        """,
        "GpuStepOperator('sweep')",
    ),
    "module_level_image.py": (
        """
        IMAGE = ImageSettings(python_package_installer="conda")  # HERE

        with DAG("module_level_image", schedule=None, start_date=START):
            GpuStepOperator(task_id="t", command=["true"], image=IMAGE)
        """,
        None,
    ),
}


@pytest.fixture(scope="module")
def import_errors(airflow_home: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``{file name: import error}`` as ``airflow dags list-import-errors --local`` reports them."""
    folder = tmp_path_factory.mktemp("dags")
    for name, (body, _) in CASES.items():
        (folder / name).write_text(HEADER + textwrap.dedent(body))
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(folder)}
    env.pop("AIRFLOW__CORE__DAGBAG_IMPORT_ERROR_TRACEBACK_DEPTH", None)  # Airflow's default: the last 2 frames
    listed = subprocess.run(
        [sys.executable, "-m", "airflow", "dags", "list-import-errors", "--local", "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert listed.returncode == 1, listed.stderr[-3000:]  # 1: there are import errors
    rows = json.loads(listed.stdout[listed.stdout.index("[{") :])
    return {Path(row["filepath"]).name: row["error"] for row in rows}


@pytest.mark.parametrize("name", list(CASES))
def test_the_import_error_names_the_dag_file_line_and_task(import_errors: dict[str, str], name: str) -> None:
    error = import_errors[name]
    source = (HEADER + textwrap.dedent(CASES[name][0])).splitlines()
    line = next(number for number, text in enumerate(source, 1) if "# HERE" in text)
    task = CASES[name][1]
    message = error.strip().splitlines()[-1]
    assert f"{name}:{line}: " in message, error
    if task is not None:
        assert f"{name}:{line}: {task}" in message, error
    frames = [text for text in error.splitlines() if text.lstrip().startswith('File "')]
    assert f'/{name}", line {line}, in ' in frames[-1], error  # Airflow keeps the last frames: the DAG's is one


def test_an_accelerator_typo_lists_the_accepted_forms(import_errors: dict[str, str]) -> None:
    message = import_errors["accelerator_typo.py"].strip().splitlines()[-1]
    assert "accelerator='A1000' is invalid: not a known accelerator model" in message
    assert "did you mean 'A100'" in message
    assert "A100-80GB" in message and "[gpu] extra_accelerators" in message


def test_settings_built_by_the_provider_point_nowhere() -> None:
    """No DAG line caused an error raised while the provider copies settings (a rendered template, on the worker)."""
    resources = ResourceSettings(gpu_count=1)
    with pytest.raises(InvalidSettingError) as raised:
        resources.with_overrides(gpu_count=-1)
    assert raised.value.dag_line is None
    assert str(raised.value).startswith("ResourceSettings: gpu_count=-1 is invalid")


def test_an_operator_built_in_python_points_at_its_caller() -> None:
    with pytest.raises(InvalidSettingError) as raised:
        GpuStepOperator(task_id="train", command=["true"], memory="lots")
    here = Path(__file__).name
    assert raised.value.dag_line is not None and Path(raised.value.dag_line[0]).name == here
    assert str(raised.value).startswith(f"{__file__}:{raised.value.dag_line[1]}: GpuStepOperator('train'): ")
    assert raised.value.__traceback__ is not None
    last = raised.value.__traceback__
    while last.tb_next is not None:
        last = last.tb_next
    assert last.tb_frame.f_code.co_filename == __file__  # the traceback ends at the line that built it
