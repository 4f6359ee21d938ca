"""``@gpu_task`` / ``@task.gpu``: the TaskFlow form of :class:`GpuStepOperator`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.operators.arguments import RESOURCE_SHORTCUTS, resolve_resources
from airflow_gpu_provider.operators.gpu_step import GpuStepOperator
from airflow_gpu_provider.placement.place import place
from airflow_gpu_provider.settings import ResourceSettings

if TYPE_CHECKING:
    from airflow.sdk.bases.decorator import TaskDecorator


class _GpuDecoratedOperator(DecoratedOperator, GpuStepOperator):  # type: ignore[misc]
    """Wraps a function into a :class:`GpuStepOperator`; arguments come from the call in the DAG.

    :param resource_settings: the task's resolved :class:`ResourceSettings` (see :func:`mappable_arguments`);
        ``resources=`` given to ``.override()`` replaces it
    """

    custom_operator_name = "@task.gpu"
    template_fields: Sequence[str] = GpuStepOperator.template_fields
    template_fields_renderers = GpuStepOperator.template_fields_renderers

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        resource_settings: ResourceSettings | None = None,
        **kwargs: Any,
    ) -> None:
        overridden = kwargs.pop("resources", None)
        super().__init__(
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            kwargs_to_upstream={"python_callable": python_callable, "op_args": op_args, "op_kwargs": op_kwargs},
            resources=resource_settings if overridden is None else overridden,
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
    on every rank under ``accelerate launch`` (the :class:`AccelerateOperator` options, ``resume`` included); rank 0's
    return value goes to XCom. ``checkpoint=`` sets the root of the task's checkpoint folder (``docs/resilience.md``).

    .. code-block:: python

        @gpu_task(gpu_count=1, memory="16Gi", requirements=["transformers==4.46.0"])
        def train(epochs: int) -> dict:
            import torch

            ...
    """
    operator_class: type[_GpuDecoratedOperator] = _GpuDecoratedOperator
    accelerate = kwargs.pop("accelerate", None)
    if accelerate is True:
        accelerate = {}
    if accelerate is not None and accelerate is not False:
        if not isinstance(accelerate, Mapping):
            raise InvalidSettingError(
                "@gpu_task",
                "accelerate",
                accelerate,
                "expected True or a mapping of launch options",
                "True, or e.g. {'num_processes': 2, 'mixed_precision': 'bf16'}",
            )
        kwargs = {**kwargs, **accelerate}
        operator_class = _accelerate_operator_class()
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=operator_class,
        **mappable_arguments(kwargs),
    )


def mappable_arguments(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Settle the resources and the GPU pool here, once, for ``.partial()/.expand()`` as for plain calls.

    A mapped task is built from these arguments without :class:`GpuStepOperator` running first, so they must
    already be final: ``resources`` travels as ``resource_settings`` (Airflow would read ``resources`` as its own
    ``BaseOperator(resources=...)``), with the concrete shortcuts applied to it and validated here, once; templated
    shortcuts stay as they are, to be applied when rendered. The pool arguments (and the executor's placement) are
    added, so that the scheduler sees the GPU pool of mapped tasks too.
    """
    kwargs = dict(kwargs)
    shortcuts = {name: kwargs.pop(name) for name in RESOURCE_SHORTCUTS if kwargs.get(name) is not None}
    settings, templated = resolve_resources(kwargs.pop("resources", None), shortcuts, owner="@task.gpu")
    kwargs = place("@task.gpu", kwargs.get("backend"), kwargs.get("backend_options"), settings, templated, kwargs)
    return {**kwargs, **templated, "resource_settings": settings}
