"""``@gpu_task`` / ``@task.gpu``: the TaskFlow form of :class:`GpuStepOperator`.

The task is settled where the function is decorated (:meth:`GpuStepOperator.settle`, as a plain or mapped operator
is), and again only where ``.override(...)`` changes it; the calls of the decorated function (``train(data)``,
``train.expand(...)``, ``train.partial(...)``) are bound to its signature first, so a wrong keyword names the
function's parameters at the DAG line instead of ending in Airflow's frames.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import attr
from airflow.sdk.bases.decorator import DecoratedOperator, _TaskDecorator

from airflow_gpu_provider.dag_line import airflow_checks, entry_point
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.operators.arguments import accepted, check_names
from airflow_gpu_provider.operators.gpu_step import GpuStepOperator
from airflow_gpu_provider.operators.spec import beside_spec, owner_name
from airflow_gpu_provider.task.call import check_binding, check_call_arguments
from airflow_gpu_provider.task.callable import shipped_callable

if TYPE_CHECKING:
    from airflow.sdk.bases.decorator import TaskDecorator
    from airflow.sdk.definitions.xcom_arg import XComArg

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


def _owner(decorator: _GpuTask, *_: Any, **__: Any) -> str:
    return str(decorator.kwargs["task_spec"].owner)


def _overridden(decorator: _GpuTask, **kwargs: Any) -> str:
    return owner_name(DECORATOR, kwargs["task_id"]) if "task_id" in kwargs else _owner(decorator)


class _GpuTask(_TaskDecorator):  # type: ignore[type-arg]
    """Airflow's decorated function, whose calls are checked against the function's signature first."""

    @entry_point(_owner)
    def __call__(self, *args: Any, **kwargs: Any) -> XComArg:
        """``train(data, lr=0.1)``: bound to ``train``'s signature here, at the DAG line, then Airflow's call."""
        shipped = shipped_callable(self.function, owner=_owner(self))  # checked when decorated: known
        check_binding(_owner(self), self.function, args, kwargs, shipped.signature)  # their JSON: the operator's
        return super().__call__(*args, **kwargs)

    @entry_point(_owner)
    def _validate_arg_names(self, func: Any, kwargs: dict[str, Any]) -> None:
        """``train.expand(...)`` and ``train.partial(...)``: the names bound to the signature (the rest may come)."""
        _task_arguments(_owner(self), self.function, self.operator_class, func, kwargs)
        check_call_arguments(_owner(self), self.function, [], kwargs, complete=False)
        with airflow_checks(_owner(self), f"{func}()"):  # a context key mapped, a value that cannot be mapped
            super()._validate_arg_names(func, kwargs)

    @entry_point(_overridden)
    def override(self, **kwargs: Any) -> _GpuTask:
        """``train.override(gpu_count=2)``: the task settled again with these arguments."""
        owner = _overridden(self, **kwargs)
        check_names(owner, self.operator_class, kwargs)
        settled = self.kwargs["task_spec"]._replace(owner=owner)
        spec = self.operator_class.settle(owner, {**kwargs, "python_callable": self.function}, settled, complete=False)
        result = cast("_GpuTask", super().override(**beside_spec(kwargs)))
        result.kwargs["task_spec"] = spec
        return result


def _task_arguments(
    owner: str, function: Callable[..., Any], operator_class: type, func: str, kwargs: Mapping[str, Any]
) -> None:
    """Refuse a task's argument given to ``.partial()`` or ``.expand()``, which take the function's: name the fix."""
    import inspect

    parameters = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return  # **kwargs takes any name: the function's
    name = next((n for n in kwargs if n not in parameters and n in accepted(operator_class)), None)
    if name is None:
        return
    called = getattr(function, "__name__", "task")
    fix = f"{called}.override({name}=...).{func}(...)"
    if func == "expand":
        own = " (each has its own checkpoint folder beneath one root)" if name == "checkpoint" else ""
        fix += (
            f" for every map index{own}; a value per map index: "
            f"GpuStepOperator.partial(task_id=..., python_callable={called}).expand({name}=[...])"
        )
    why = f"{name} is an argument of the task, not of {called}(), and .{func}() takes {called}()'s arguments"
    raise InvalidSettingError(owner, name, kwargs[name], why, fix)


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

    Takes every :class:`GpuStepOperator` argument: ``resources=``, ``image=``, ``backend=``, ``on_missing_gpu=``,
    the shortcuts ``gpu_count=``, ``memory=``, ``accelerator=``, ``requirements=``, ..., ``checkpoint=``,
    ``resume=``, ``deferrable=``, ``durable=``, ``wait_timeout=``, ``right_size=`` and ``modules=``. The function's
    return value goes to XCom (``multiple_outputs=True`` unrolls a dict).

    ``accelerate=True`` or ``accelerate={"num_processes": 2, "mixed_precision": "bf16", ...}`` runs the function
    on every rank under ``accelerate launch`` (the :class:`AccelerateOperator` options); rank 0's return value goes
    to XCom.

    The task is settled once, when the function is decorated (mapped tasks too: the scheduler reads their GPU pool
    from the decorator's arguments); errors name it as written, ``@task.gpu('train')``, at the DAG line.

    .. code-block:: python

        @gpu_task(gpu_count=1, memory="16Gi", requirements=["transformers==4.46.0"])
        def train(epochs: int) -> dict:
            import torch

            ...
    """

    def owner(function: Callable[..., Any]) -> str:
        return owner_name(DECORATOR, kwargs.get("task_id") or getattr(function, "__name__", None))

    @entry_point(owner)  # called where the function is decorated: errors point at that line
    def decorate(function: Callable[..., Any]) -> TaskDecorator:
        operator_class: type[GpuStepOperator] = _GpuDecoratedOperator
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
            from airflow_gpu_provider.operators.accelerate import split_launch

            operator_class = _accelerate_operator_class()  # accelerate={...}: its options, or the operator's
            arguments.update({} if accelerate is True else accelerate)
            by_name, arguments = split_launch(operator_class, arguments)
            arguments["launch_options"] = {**dict(arguments.get("launch_options") or {}), **by_name}
        check_names(owner(function), operator_class, arguments)
        spec = operator_class.settle(owner(function), {**arguments, "python_callable": function}, complete=False)
        with airflow_checks(spec.owner, f"{DECORATOR}(...)"):  # the types of BaseOperator's arguments
            return _GpuTask(  # type: ignore[return-value]
                function=function,
                multiple_outputs=attr.NOTHING if multiple_outputs is None else multiple_outputs,  # type: ignore[arg-type]
                operator_class=operator_class,
                kwargs={**spec.placed(beside_spec(arguments)), "task_spec": spec},
            )

    if python_callable is None:
        return decorate  # type: ignore[return-value]  # @task.gpu(...): called with the function next
    return decorate(python_callable)
