"""``@gpu_task`` / ``@task.gpu``: the TaskFlow form of :class:`GpuStepOperator`."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from airflow_gpu_provider.operators.gpu_step import GpuStepOperator

if TYPE_CHECKING:
    from airflow.sdk.bases.decorator import TaskDecorator


class _GpuDecoratedOperator(DecoratedOperator, GpuStepOperator):  # type: ignore[misc]
    """Wraps a function into a :class:`GpuStepOperator`; arguments come from the call in the DAG."""

    custom_operator_name = "@task.gpu"
    template_fields: Sequence[str] = GpuStepOperator.template_fields
    template_fields_renderers = GpuStepOperator.template_fields_renderers

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            kwargs_to_upstream={"python_callable": python_callable, "op_args": op_args, "op_kwargs": op_kwargs},
            **kwargs,
        )


def gpu_task(
    python_callable: Callable[..., Any] | None = None,
    multiple_outputs: bool | None = None,
    **kwargs: Any,
) -> TaskDecorator:
    """Run the decorated function as a GPU task (also available as ``@task.gpu``).

    Takes every :class:`GpuStepOperator` argument: ``resources=``, ``image=``, ``backend=``, ``on_missing_gpu=``
    and the shortcuts ``gpu_count=``, ``memory=``, ``accelerator=``, ``requirements=``, ... The function's return
    value goes to XCom (``multiple_outputs=True`` unrolls a dict).

    .. code-block:: python

        @gpu_task(gpu_count=1, memory="16Gi", requirements=["transformers==4.46.0"])
        def train(epochs: int) -> dict:
            import torch

            ...
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_GpuDecoratedOperator,
        **kwargs,
    )
