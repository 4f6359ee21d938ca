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
    # the front door: what a mapped task, Airflow's own binding or a deferred check let through before
    "mapped_decorator_checkpoint.py": (
        """
        @dag(schedule=None, start_date=START)
        def mapped_decorator_checkpoint():
            @task.gpu(checkpoint="ckpt")  # HERE: a relative path
            def train(x):
                return x

            train.expand(x=[1, 2])

        mapped_decorator_checkpoint()
        """,
        "@task.gpu('train')",
    ),
    "mapped_decorator_deferrable.py": (
        """
        @dag(schedule=None, start_date=START)
        def mapped_decorator_deferrable():
            @task.gpu(deferrable="yes")  # HERE
            def train(x):
                return x

            train.expand(x=[1, 2])

        mapped_decorator_deferrable()
        """,
        "@task.gpu('train')",
    ),
    "mapped_decorator_resume.py": (
        """
        @dag(schedule=None, start_date=START)
        def mapped_decorator_resume():
            @task.gpu(resume=True, checkpoint=False)  # HERE
            def train(x):
                return x

            train.expand(x=[1, 2])

        mapped_decorator_resume()
        """,
        "@task.gpu('train')",
    ),
    "override_mapped.py": (
        """
        @dag(schedule=None, start_date=START)
        def override_mapped():
            @task.gpu
            def train(x):
                return x

            train.override(task_id="fit", checkpoint="ckpt").expand(x=[1, 2])  # HERE

        override_mapped()
        """,
        "@task.gpu('fit')",
    ),
    "checkpoint_in_decorator.py": (
        """
        @dag(schedule=None, start_date=START)
        def checkpoint_in_decorator():
            @task.gpu(checkpoint=5)  # HERE
            def train():
                return 1

            train()

        checkpoint_in_decorator()
        """,
        "@task.gpu('train')",
    ),
    "unknown_decorator_keyword.py": (
        """
        @dag(schedule=None, start_date=START)
        def unknown_decorator_keyword():
            @task.gpu(gpu_memory="16Gi")  # HERE
            def train():
                return 1

            train()

        unknown_decorator_keyword()
        """,
        "@task.gpu('train')",
    ),
    "unknown_operator_keyword.py": (
        """
        with DAG("unknown_operator_keyword", schedule=None, start_date=START):
            GpuStepOperator(task_id="prepare", command=["true"], gpu_memory="16Gi")  # HERE
        """,
        "GpuStepOperator('prepare')",
    ),
    "call_keyword.py": (
        """
        @dag(schedule=None, start_date=START)
        def call_keyword():
            @task.gpu
            def train(data, lr):
                return data

            train([1, 2], learning_rate=0.1)  # HERE

        call_keyword()
        """,
        "@task.gpu('train')",
    ),
    "expand_keyword.py": (
        """
        @dag(schedule=None, start_date=START)
        def expand_keyword():
            @task.gpu
            def train(data, lr):
                return data

            train.partial(data=[1]).expand(learning_rate=[0.1, 0.2])  # HERE

        expand_keyword()
        """,
        "@task.gpu('train')",
    ),
    "airflow_argument.py": (
        """
        with DAG("airflow_argument", schedule=None, start_date=START):
            GpuStepOperator(task_id="prepare", command=["true"], pool_slots=0)  # HERE: Airflow's own check
        """,
        "GpuStepOperator('prepare')",
    ),
    "expand_value.py": (
        """
        @dag(schedule=None, start_date=START)
        def expand_value():
            @task.gpu
            def train(x):
                return x

            train.expand(x=5)  # HERE: a value Airflow cannot map over

        expand_value()
        """,
        "@task.gpu('train')",
    ),
    "module_level_import.py": (
        """
        import json

        @dag(schedule=None, start_date=START)
        def module_level_import():
            @task.gpu
            def dump(value):
                return json.dumps(value)  # HERE: json is the DAG file's, not the function's

            dump(1)

        module_level_import()
        """,
        "@task.gpu('dump')",
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
    if task is not None:
        assert message.count(task.split("(")[0] + "(") == 1, message  # the task is named once


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("unknown_decorator_keyword.py", ["does not support the argument(s) 'gpu_memory'", "Did you mean 'memory'"]),
        ("unknown_operator_keyword.py", ["does not support the argument(s) 'gpu_memory'", "Did you mean 'memory'"]),
        (
            "call_keyword.py",
            ["train(data, learning_rate=...) is invalid: no parameter 'learning_rate'", "'lr' missing"],
        ),
        ("call_keyword.py", ["Did you mean 'lr'?", "Accepted: the parameters of train(data, lr)"]),
        ("expand_keyword.py", ["train(learning_rate=...) is invalid: no parameter 'learning_rate'", "train(data, lr)"]),
        ("module_level_import.py", ["it uses 'json' from outside the function"]),
        ("airflow_argument.py", ["BaseOperator(...) is invalid: Airflow refuses it: pool slots for prepare"]),
        ("expand_value.py", ["expand() is invalid: Airflow refuses it: expand() got an unexpected type 'int'"]),
        ("mapped_decorator_checkpoint.py", ["checkpoint='ckpt' is invalid: a relative path"]),
        ("mapped_decorator_deferrable.py", ["deferrable='yes' is invalid: not a boolean"]),
        ("mapped_decorator_resume.py", ["resume=True is invalid: a task without a checkpoint folder"]),
        ("override_mapped.py", ["checkpoint='ckpt' is invalid: a relative path"]),
        ("checkpoint_in_decorator.py", ["checkpoint=5 is invalid: expected a path or URI"]),
    ],
)
def test_the_import_error_says_what_is_wrong_and_what_is_accepted(
    import_errors: dict[str, str], name: str, words: list[str]
) -> None:
    message = import_errors[name].strip().splitlines()[-1]
    assert all(word in message for word in words), message


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
