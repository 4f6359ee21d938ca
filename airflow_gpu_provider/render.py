"""Render what a GPU task would submit to Kubernetes, without a cluster: ``GpuStepOperator.render_manifests()``.

From the command line, for one task of a DAG file (YAML documents on stdout, ready for
``kubectl apply --dry-run=server -f -``)::

    python -m airflow_gpu_provider.render dags/gpu_training_demo.py train --params '{"gpu_count": 2}'

Without a task context, templates are rendered with the DAG's default params (updated by ``params``), upstream
XCom arguments are shown as ``"<XCom from TASK>"`` placeholders, and the run labels say ``run_id=render``. The
backend is ``kubernetes`` (the backend that renders), whatever the task's ``backend`` resolves to.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator

TaskT = TypeVar("TaskT", bound="BaseOperator")
RENDER_RUN_ID = "render"


@dataclass
class _RenderTaskInstance:
    """The task-instance fields a rendered pod's labels and context values use."""

    dag_id: str
    task_id: str
    run_id: str = RENDER_RUN_ID
    try_number: int = 1
    map_index: int = -1


def _placeholders(value: Any) -> Any:
    """Replace upstream XCom references (unknown before a run) with readable placeholders."""
    from airflow.sdk import XComArg

    if isinstance(value, XComArg):
        upstream = getattr(value, "operator", None)
        return f"<XCom from {getattr(upstream, 'task_id', 'upstream')}>"
    if isinstance(value, Mapping):
        return {key: _placeholders(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_placeholders(item) for item in value]
    return value


def stand_in(task: TaskT, params: Mapping[str, Any] | None = None) -> tuple[TaskT, Any]:
    """A copy of ``task`` with its templates rendered, and the minimal context they were rendered with.

    The context has the DAG's default params (updated by ``params``) and a render task instance; the DAG's own task
    object stays untouched.
    """
    dag = task.dag if task.has_dag() else None
    defaults = dict(dag.params.dump()) if dag is not None else {}
    context: Any = {
        "ti": _RenderTaskInstance(dag.dag_id if dag is not None else "render", task.task_id),
        "run_id": RENDER_RUN_ID,
        "params": {**defaults, **(params or {})},
        "dag": dag,
    }
    rendered = copy.copy(task)
    for name in task.template_fields:
        setattr(rendered, name, task.render_template(_placeholders(getattr(task, name)), context))
    return rendered, context


def render_task(
    task: Any,
    context: Any = None,
    *,
    params: Mapping[str, Any] | None = None,
    backend: str = "kubernetes",
    after: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """What ``task`` (a ``GpuStepOperator``) would submit to a backend that renders (its ``render_manifests``)."""
    from airflow_gpu_provider.backends import BACKENDS
    from airflow_gpu_provider.config.worker import GpuConfig
    from airflow_gpu_provider.escalation import tries as escalation
    from airflow_gpu_provider.exceptions import InvalidSettingError

    rendered, rendering = (task, context) if context is not None else stand_in(task, params)
    owner = task.task_spec.owner
    tries = escalation.Tries.after(task.on_oom, {}, after) if task.on_oom is not None else None
    if after and tries is None:
        raise InvalidSettingError(owner, "after", list(after), "no on_oom")
    spec = rendered.rendered_spec(backend=backend)
    if not spec.info.renders:
        able = [name for name, other in BACKENDS.items() if other.renders]
        raise InvalidSettingError(owner, "backend", backend, "it cannot render", repr(able))
    conf = GpuConfig.read()
    request = rendered.task_request(rendering, spec, conf, tries)
    return spec.info.backend_class()(spec.options, log=task.log).render(request, conf, rendering)


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """YAML documents in the API's field order; multi-line strings (the install script) as literal blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump_all(objects, Dumper=Dumper, sort_keys=False, width=120)


def _render_file(
    dag_file: str, task_id: str, dag_id: str | None, params: Mapping[str, Any], after: list[str]
) -> list[dict[str, Any]] | None:
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # before Airflow 3.2
        from airflow.models.dagbag import DagBag  # type: ignore[no-redef]

    bag = DagBag(dag_folder=dag_file)
    if bag.import_errors:
        for path, error in bag.import_errors.items():
            print(f"{path}: {error}", file=sys.stderr)
        return None
    dags = [bag.get_dag(dag_id)] if dag_id else list(bag.dags.values())
    tasks = [dag.get_task(task_id) for dag in dags if dag is not None and dag.has_task(task_id)]
    if len(tasks) != 1:
        print(f"{task_id!r}: found {len(tasks)} tasks of that id in {dag_file}", file=sys.stderr)
        return None
    if not hasattr(tasks[0], "render_manifests"):
        print(f"{task_id!r} is a {type(tasks[0]).__name__}, not a GPU task", file=sys.stderr)
        return None
    return list(tasks[0].render_manifests(params=params, after=after))


def main(argv: list[str] | None = None) -> int:
    """``python -m airflow_gpu_provider.render DAG_FILE TASK_ID [--params JSON] [--after KINDS] [--format ...]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dag_file")
    parser.add_argument("task_id")
    parser.add_argument("--dag-id", help="the DAG, when the file defines several")
    parser.add_argument("--params", default="{}", help="JSON object replacing the DAG's default params")
    parser.add_argument(
        "--after",
        default="",
        help="how earlier tries ended, e.g. gpu_oom,host_oom: the try the on_oom ladder gives next",
    )
    parser.add_argument("--format", choices=("yaml", "json"), default="yaml")
    args = parser.parse_args(argv)
    after = [kind.strip() for kind in args.after.split(",") if kind.strip()]
    with contextlib.redirect_stdout(sys.stderr):  # Airflow's log lines must not mix with the manifests
        objects = _render_file(args.dag_file, args.task_id, args.dag_id, json.loads(args.params), after)
    if objects is None:
        return 1
    if args.format == "json":
        print(json.dumps(objects, indent=2))
    else:
        print(to_yaml(objects), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
