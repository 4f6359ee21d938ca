from __future__ import annotations

import inspect
import json
import os

import pytest
from airflow.sdk import task

from airflow_gpu_provider import gpu_task
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.task.call import call_arguments
from airflow_gpu_provider.task.callable import shipped_callable

MODULE_CONSTANT = 3


@task.gpu(
    gpu_count=1,
    memory="1Gi",
)
def decorated_with_task_gpu(x):
    return x + 1


@gpu_task(gpu_count=1)
def decorated_with_gpu_task(x):
    return x * 2


def uses_module_constant():
    return MODULE_CONSTANT


def uses_module_import():
    return os.getpid()


def self_contained(epochs: int, params=None):
    import math

    def helper(v):
        return math.sqrt(v)

    total = [helper(i) for i in range(epochs)]
    try:
        pass
    except ValueError as err:
        print(err)
    return {"total": sum(total), "params": params}


def wants_ti(ti=None):
    return None


def shadowed_in_a_nested_function():
    def helper(json):  # binds json only inside helper
        return json

    return helper(1), json.dumps({})  # the module's json: not shipped


def module_name_in_a_default(indent=json.dumps({})):  # noqa: B008 - a module name in a default, on purpose
    return indent


def module_name_in_a_comprehension_only():
    return [os.sep for _ in range(2)]


def annotated_with_module_names(value: os.PathLike) -> json.JSONDecoder:  # annotations are never evaluated
    return value


def test_decorators_are_stripped_from_the_shipped_source():
    for decorated, expected_first_line in (
        (decorated_with_task_gpu, "def decorated_with_task_gpu(x):"),
        (decorated_with_gpu_task, "def decorated_with_gpu_task(x):"),
    ):
        shipped = shipped_callable(decorated.function, owner="t")
        assert shipped.source.splitlines()[0] == expected_first_line
        assert "@" not in shipped.source
        _, start = inspect.getsourcelines(decorated.function)
        assert shipped.first_line > start  # the 'def' line, after the decorator lines


def test_self_contained_function_with_nested_names_ships():
    shipped = shipped_callable(self_contained, owner="t")
    assert shipped.name == "self_contained"
    assert shipped.context_params == ("params",)


@pytest.mark.parametrize(
    ("function", "names"),
    [
        (uses_module_constant, "'MODULE_CONSTANT'"),
        (uses_module_import, "'os'"),
        (shadowed_in_a_nested_function, "'json'"),
        (module_name_in_a_default, "'json'"),
        (module_name_in_a_comprehension_only, "'os'"),
    ],
)
def test_module_level_names_are_rejected_at_parse_time(function, names):
    with pytest.raises(InvalidSettingError, match=f"it uses {names} from outside the function"):
        shipped_callable(function, owner="GpuStepOperator('t')")


def test_closures_lambdas_async_and_context_objects_are_rejected():
    factor = 2

    def closure(x):
        return x * factor

    async def coroutine():
        return 1

    with pytest.raises(InvalidSettingError, match="'factor' from outside"):
        shipped_callable(closure, owner="t")
    with pytest.raises(InvalidSettingError, match="only plain functions"):
        shipped_callable(lambda: 1, owner="t")
    with pytest.raises(InvalidSettingError, match="async functions"):
        shipped_callable(coroutine, owner="t")
    with pytest.raises(InvalidSettingError, match="'ti' ask for Airflow context objects.*params"):
        shipped_callable(wants_ti, owner="t")


def test_annotations_are_not_names_the_function_reads():
    assert shipped_callable(annotated_with_module_names, owner="t").name == "annotated_with_module_names"


def test_call_arguments_fill_context_values_and_check_json():
    shipped = shipped_callable(self_contained, owner="t")
    signature = inspect.signature(self_contained)
    args, kwargs = call_arguments(shipped, signature, [3], {}, {"params": {"epochs": 3}}, owner="t")
    assert args == [3]
    assert kwargs == {"params": {"epochs": 3}}
    args, kwargs = call_arguments(shipped, signature, [], {"epochs": (1, 2)}, {}, owner="t")
    assert kwargs["epochs"] == [1, 2]  # tuples travel as lists
    json.dumps(kwargs)
    with pytest.raises(TypeError, match="t: argument epochs is a set, which cannot travel as JSON"):
        call_arguments(shipped, signature, [], {"epochs": {1}}, {}, owner="t")
    with pytest.raises(TypeError, match=r"argument epochs is nan \(not finite\), which cannot travel"):
        call_arguments(shipped, signature, [], {"epochs": float("nan")}, {}, owner="t")


def test_classes_enums_and_typed_helpers_defined_in_the_function_work_as_in_a_module(airflow_home):
    """A dataclass, an enum, attrs and pydantic models and a typed helper inside a @task.gpu function, in a DAG
    file without ``from __future__ import annotations``: the body's annotations are evaluated, as in that file."""
    from conftest import REPO
    from helpers import load_dag, run_dag, task_states, xcom

    dag_run = run_dag(load_dag(REPO / "tests" / "dags" / "function_scope_dags.py", "function_scope"))
    assert task_states(dag_run) == {"typed_code": "success"}
    assert xcom(dag_run, "typed_code") == {
        "config": {"rate": 0.5, "layers": 2},
        "field_types": ["float", "int"],
        "hints": {"config": "Config", "stage": "Stage", "return": "float"},
        "scaled": 0.05,
        "metrics": {"config": {"rate": 0.5, "layers": 2}, "stage": "train", "loss": 0.5},
        "counter": {"steps": 3},
        "module": "__gpu_task__",
    }


@pytest.mark.parametrize("future", [True, False])
def test_annotations_in_the_body_are_read_unless_the_dag_file_defers_them(tmp_path, monkeypatch, future):
    """As the runtime compiles the body: with the DAG file's own future import or without it."""
    import importlib

    source = (
        "from __future__ import annotations\n" * future + "import pathlib\n\n\n"
        "def train(folder: pathlib.Path) -> None:\n"
        "    import dataclasses\n\n"
        "    @dataclasses.dataclass\n"
        "    class Batch:\n"
        "        where: pathlib.Path\n"
    )
    (tmp_path / f"scope_{future}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    train = importlib.import_module(f"scope_{future}").train
    if future:  # deferred: 'pathlib' is read by no one
        assert shipped_callable(train, owner="t").annotations_future is True
    else:  # evaluated in the body (not in the signature, which is never evaluated)
        with pytest.raises(InvalidSettingError, match="it uses 'pathlib' from outside the function"):
            shipped_callable(train, owner="t")


def test_a_shipped_function_is_read_when_asked_and_not_kept_alive_by_the_cache(tmp_path, monkeypatch):
    """The parse path reads no source of a self-contained function; the cache of shipped functions is weak."""
    import gc
    import importlib
    import sys
    import weakref

    (tmp_path / "lazy_source.py").write_text("def step(n):\n    import math\n    return math.sqrt(n)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    step = importlib.import_module("lazy_source").step
    shipped = shipped_callable(step, owner="t")
    (tmp_path / "lazy_source.py").write_text("def step(n):\n    import math\n    return math.sqrt(n)  # read\n")
    assert shipped.source.endswith("# read\n")  # read now, when the task starts (the worker's file)
    assert (shipped.first_line, shipped.filename) == (1, str(tmp_path / "lazy_source.py"))
    alive = weakref.ref(step)
    del step, sys.modules["lazy_source"]
    gc.collect()
    assert alive() is None
    assert shipped.source.startswith("def step(n):")  # what it read stays

    (tmp_path / "lazy_other.py").write_text("def step(n):\n    return n\n")
    other = shipped_callable(importlib.import_module("lazy_other").step, owner="t")
    (tmp_path / "lazy_other.py").write_text("def renamed(n):\n    return n\n\n\n")  # changed before the task starts
    with pytest.raises(InvalidSettingError, match="lazy_other.py:1 holds other code: the file changed"):
        other.source  # noqa: B018 - read now: never another function's source
