"""``@gpu_task`` / ``@task.gpu``: the TaskFlow form of :class:`GpuStepOperator`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.operators.gpu_step import (
    RESOURCE_SHORTCUTS,
    GpuStepOperator,
    pool_arguments,
    resolve_resources,
)
from airflow_gpu_provider.settings import ResourceSettings
from airflow_gpu_provider.settings.accelerators import VENDORS

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
    on every rank under ``accelerate launch`` (the :class:`AccelerateOperator` options); rank 0's return value
    goes to XCom.

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
    """Settle ``resources`` and the GPU pool here, for ``.partial()/.expand()`` as for plain calls.

    A mapped task is built from these arguments without :class:`GpuStepOperator` running first: Airflow would
    read ``resources`` as its own ``BaseOperator(resources=...)`` and the scheduler would never see the GPU pool.
    So a :class:`ResourceSettings` becomes shortcuts (explicit shortcuts win, as in the operator) and the pool
    arguments are added. Resolving the shortcuts here is also the only parse-time check of a mapped task's
    resources (a plain call checks them again in the operator, at ~10 µs).
    """
    kwargs = dict(kwargs)
    resources = kwargs.get("resources")
    if isinstance(resources, ResourceSettings):
        del kwargs["resources"]
        defaults = ResourceSettings()
        for name in RESOURCE_SHORTCUTS:
            value = getattr(resources, name)
            if kwargs.get(name) is None and value != getattr(defaults, name):
                kwargs[name] = value.name if name == "gpu_vendor" and VENDORS.get(value.name) == value else value
    if "pool" not in kwargs:
        settings, overrides = resolve_resources(None, {name: kwargs.get(name) for name in RESOURCE_SHORTCUTS})
        kwargs = {**pool_arguments(settings, overrides), **kwargs}
    return kwargs
