"""``@gpu_task`` / ``@task.gpu``: the TaskFlow form of :class:`GpuStepOperator`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from airflow_gpu_provider.dag_line import entry_point
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.operators.gpu_step import GpuStepOperator
from airflow_gpu_provider.operators.spec import TaskSpec, beside_spec
from airflow_gpu_provider.task.modules import ProjectModules

if TYPE_CHECKING:
    from airflow.sdk.bases.decorator import TaskDecorator

DECORATOR = "@task.gpu"


class _GpuDecoratedOperator(DecoratedOperator, GpuStepOperator):  # type: ignore[misc]
    """Wraps a function into a :class:`GpuStepOperator`; arguments come from the call in the DAG.

    The task arrives settled (``task_spec``, see :func:`gpu_task`); ``.override(...)`` arguments settle it again.
    """

    custom_operator_name = DECORATOR
    template_fields: Sequence[str] = GpuStepOperator.template_fields
    template_fields_renderers = GpuStepOperator.template_fields_renderers

    def __init__(
        self, *, python_callable: Callable[..., Any], op_args: Any = None, op_kwargs: Any = None, **kwargs: Any
    ):
        super().__init__(
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            kwargs_to_upstream={"python_callable": python_callable, "op_args": op_args, "op_kwargs": op_kwargs},
            **kwargs,
        )


@functools.cache
def _accelerate_operator_class() -> type[_GpuDecoratedOperator]:
    """``@gpu_task(accelerate=...)``'s operator, built on first use (most DAGs never import Accelerate support)."""
    from airflow_gpu_provider.operators.accelerate import AccelerateOperator

    class _AccelerateDecoratedOperator(_GpuDecoratedOperator, AccelerateOperator):  # type: ignore[misc]
        """The function runs on every rank under ``accelerate launch``."""

        template_fields: Sequence[str] = AccelerateOperator.template_fields

    return _AccelerateDecoratedOperator


def gpu_task(
    python_callable: Callable[..., Any] | None = None,
    multiple_outputs: bool | None = None,
    **kwargs: Any,
) -> TaskDecorator:
    """Run the decorated function as a GPU task (also available as ``@task.gpu``).

    Takes every :class:`GpuStepOperator` argument: ``resources=``, ``image=``, ``backend=``, ``on_missing_gpu=``
    and the shortcuts ``gpu_count=``, ``memory=``, ``accelerator=``, ``requirements=``, ... The function's return
    value goes to XCom (``multiple_outputs=True`` unrolls a dict).

    ``accelerate=True`` or ``accelerate={"num_processes": 2, "mixed_precision": "bf16", ...}`` runs the function
    on every rank under ``accelerate launch`` (the :class:`AccelerateOperator` options); rank 0's return value goes
    to XCom. ``checkpoint=`` sets the root of the task's checkpoint folder, and ``resume=True`` resumes each retry
    from its newest checkpoint (``docs/resilience.md``).

    The task is settled once, when the function is decorated (mapped tasks too: the scheduler reads their GPU pool
    from the decorator's arguments); errors name it as written, ``@task.gpu('train')``.

    .. code-block:: python

        @gpu_task(gpu_count=1, memory="16Gi", requirements=["transformers==4.46.0"])
        def train(epochs: int) -> dict:
            import torch

            ...
    """

    def owner(function: Callable[..., Any]) -> str:
        return f"{DECORATOR}({kwargs.get('task_id') or getattr(function, '__name__', '?')!r})"

    @entry_point(owner)  # called where the function is decorated: errors point at that line
    def decorate(function: Callable[..., Any]) -> TaskDecorator:
        operator_class: type[_GpuDecoratedOperator] = _GpuDecoratedOperator
        arguments = dict(kwargs)
        accelerate = arguments.pop("accelerate", None)
        if accelerate is not None and accelerate is not False:
            if accelerate is not True and not isinstance(accelerate, Mapping):
                raise InvalidSettingError(
                    owner(function),
                    "accelerate",
                    accelerate,
                    "expected True or a mapping of launch options",
                    "True, or e.g. {'num_processes': 2, 'mixed_precision': 'bf16'}",
                )
            arguments.update({} if accelerate is True else accelerate)
            operator_class = _accelerate_operator_class()
        spec = TaskSpec.settle(owner(function), arguments, num_nodes=operator_class._nodes(arguments))
        if arguments.get("modules") is not None:  # now: a mapped task's operator is made only when it runs
            ProjectModules.settle(owner(function), arguments["modules"], inspect.getsourcefile(function))
        return task_decorator_factory(
            python_callable=function,
            multiple_outputs=multiple_outputs,
            decorated_operator_class=operator_class,
            task_spec=spec,
            **spec.placed(beside_spec(arguments)),
        )

    if python_callable is None:
        return decorate  # type: ignore[return-value]  # @task.gpu(...): called with the function next
    return decorate(python_callable)
