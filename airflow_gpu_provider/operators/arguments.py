"""Each argument of a GPU task, checked when the DAG is parsed: its name, and how the values of each group settle.

:meth:`TaskSpec.settle <.spec.TaskSpec.settle>` calls these for a plain task (the operator's ``__init__``), a mapped
one (``.partial()``) and a decorated one (``@task.gpu``) alike. The names a GPU task takes are its operator's
declared arguments, the very list Airflow's ``.partial()`` and ``.expand()`` check; any other name is refused here,
with the closest known ones. How a try runs (``checkpoint``, ``resume``, ``deferrable``, ``durable``,
``wait_timeout``) settles in :func:`run_options`; the payload (the function or command and its arguments) where
the call is made (:func:`check_payload`).

A new argument (``right_size=``, say) is three steps: declared and documented on ``GpuStepOperator.__init__`` (the
architecture test checks that ``.partial()`` and ``@task.gpu`` take every documented one), checked here, and held
in a :class:`~.spec.TaskSpec` field that the try reads (``durable`` reaches the backends as ``TaskRequest.durable``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Collection, Iterable, Iterator, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_gpu_provider import config
from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings

if TYPE_CHECKING:
    from airflow_gpu_provider.task.callable import ShippedCallable

#: The resource fields a task may give one by one (``gpu_count=2``) instead of a whole ``ResourceSettings``.
RESOURCE_SHORTCUTS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ResourceSettings))
#: The image fields a task may give one by one (``requirements=[...]``).
IMAGE_SHORTCUTS: tuple[str, ...] = ("parent_image", "requirements", "python_package_installer")
#: How a try runs: what :func:`run_options` settles.
RUN_OPTIONS = ("checkpoint", "resume", "deferrable", "durable", "reattach", "wait_timeout", "right_size")
_BOOLEAN = "True or False"


def is_template(value: object) -> bool:
    """Whether a value is a Jinja template to be rendered when the task runs."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


# ------------------------------------------------------------------ names
@functools.cache
def accepted(operator_class: type) -> frozenset[str]:
    """The keyword arguments ``operator_class`` declares, with its bases': what Airflow's ``.partial()`` accepts."""
    names: set[str] = set()
    for klass in operator_class.__mro__:
        names |= getattr(vars(klass).get("__init__"), "_BaseOperatorMeta__param_names", set())
    return frozenset(names)


def check_names(
    owner: str, operator_class: type, names: Iterable[str], *, also: Collection[str] = (), near: Iterable[str] = ()
) -> None:
    """Refuse a keyword that ``operator_class`` does not take, naming the closest ones (``gpu_memory``: ``memory``).

    :param also: names taken besides the declared ones (the decorator's ``accelerate``)
    :param near: names offered as the closest too (``accelerate launch`` options, which AccelerateOperator takes)
    """
    known = accepted(operator_class)
    unknown = [name for name in names if name not in known and name not in also]
    if not unknown:
        return
    from airflow.sdk import BaseOperator

    own = sorted((known - accepted(BaseOperator) - {"task_spec", "kwargs_to_upstream"}) | set(also))
    listed = f"{', '.join(own)}; and BaseOperator's (retries, pool, queue, execution_timeout, ...)"
    raise UnknownSettingError(owner, unknown, [*known, *also, *near], what="argument", listed=listed)


# ------------------------------------------------------------------ settings
@contextlib.contextmanager
def named(owner: str) -> Iterator[None]:
    """Errors of the settings a task was given name the task (``@task.gpu('train')``), not the settings class."""
    try:
        yield
    except UnknownSettingError:
        raise
    except InvalidSettingError as err:
        if err.owner in ("ResourceSettings", "ImageSettings"):
            raise InvalidSettingError(owner, err.field, err.value, err.reason, err.accepted) from None
        raise


def resources_of(owner: str, given: Mapping[str, Any]) -> tuple[ResourceSettings, dict[str, Any]]:
    """The resources with the concrete shortcuts applied (checked); the templated shortcuts apart."""
    resources = given.get("resources")
    if resources is not None and not isinstance(resources, ResourceSettings):
        raise InvalidSettingError(owner, "resources", resources, "expected a ResourceSettings", None)
    shortcuts = {name: given[name] for name in RESOURCE_SHORTCUTS if given.get(name) is not None}
    templated = {name: value for name, value in shortcuts.items() if is_template(value)}
    concrete = {name: value for name, value in shortcuts.items() if name not in templated}
    if resources is None and all(type(value) in _PLAIN for value in concrete.values()):
        return _from_shortcuts(tuple((name, type(value), value) for name, value in concrete.items())), templated
    settings = resources or ResourceSettings()
    return (settings.with_overrides(**concrete) if concrete else settings), templated


_PLAIN = (str, int, float, bool)


@functools.lru_cache(maxsize=256)
def _from_shortcuts(shortcuts: tuple[tuple[str, type, Any], ...]) -> ResourceSettings:
    """The resources of plain shortcut values (``gpu_count=1, memory="8Gi"``), checked once per process.

    The tasks of a DAG mostly ask alike, and the settings are immutable: one object serves them all. Each value's
    type is part of the key (``True`` is no ``1``); an error is raised again for every task that makes it.
    """
    overrides = {name: value for name, _, value in shortcuts}
    return ResourceSettings().with_overrides(**overrides) if overrides else ResourceSettings()


def image_of(owner: str, given: Mapping[str, Any]) -> ImageSettings:
    """The image with its shortcuts applied (checked)."""
    image = given.get("image")
    if image is not None and not isinstance(image, ImageSettings):
        raise InvalidSettingError(owner, "image", image, "expected an ImageSettings", None)
    changes = {name: given[name] for name in IMAGE_SHORTCUTS if given.get(name) is not None}
    image = image or ImageSettings()
    return dataclasses.replace(image, **changes) if changes else image


def check_accelerator(owner: str, resources: ResourceSettings) -> None:
    """Each of the task's accelerators is a known model, one of ``[gpu] devices`` or of ``[gpu] extra_accelerators``."""
    if resources.accelerator is None:
        return
    from airflow_gpu_provider.host.inventory import parse_devices
    from airflow_gpu_provider.settings.accelerators import check_model

    listed = [d.name for d in parse_devices(config.get("devices")) or [] if d.name]
    extra = [name.strip() for name in config.get("extra_accelerators").split(",") if name.strip()]
    for model in resources.accelerators:
        check_model(owner, model, [*extra, *listed])


def policy_of(owner: str, given: Mapping[str, Any]) -> Any:
    """``on_missing_gpu`` (default ``[gpu] on_missing_gpu``), checked; ``None`` while it is a template."""
    policy = given.get("on_missing_gpu")
    if policy is None:
        policy = config.get("on_missing_gpu")
    if is_template(policy):
        return None
    from airflow_gpu_provider.task import missing_gpu

    return config.check_choice(owner, "on_missing_gpu", policy, missing_gpu.NAMES)


def backend_options_of(owner: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """``backend_options`` as given: a mapping (its backend parses it)."""
    options = given.get("backend_options")
    if options is not None and not isinstance(options, Mapping):
        raise InvalidSettingError(
            owner, "backend_options", options, "expected a mapping of option names to values",
            "a dict such as {'namespace': 'ml'}",
        )  # fmt: skip
    return dict(options or {})


def on_oom_of(owner: str, given: Mapping[str, Any], resources: ResourceSettings, templated: object) -> Any:
    """The ``on_oom`` ladder, checked against the resources (templated ones: when they are rendered)."""
    on_oom = given.get("on_oom")
    if on_oom is None:
        return None
    from airflow_gpu_provider.settings.escalation import OomEscalation  # loads only for tasks that have a ladder

    if not isinstance(on_oom, OomEscalation):
        raise InvalidSettingError(
            owner, "on_oom", on_oom, "expected an OomEscalation", "OomEscalation(accelerators=['L4', 'A100-80GB'])"
        )
    if not templated:
        on_oom.check(resources, owner=owner)
    return on_oom


def modules_of(owner: str, given: Mapping[str, Any], arguments: Mapping[str, Any]) -> Any:
    """The project modules to ship (``modules=``), found beside the DAG file; ``None`` for none."""
    if given.get("modules") is None:
        return None
    from airflow_gpu_provider.task.modules import ProjectModules  # loads only for tasks that ship some

    return ProjectModules.settle(owner, given["modules"], dag_file(arguments))


def dag_file(arguments: Mapping[str, Any]) -> str | None:
    """The DAG file of a task: its function's, else its DAG's (``dag=``, or the ``with DAG(...)`` block around it)."""
    function = arguments.get("python_callable")
    if function is not None:
        import inspect

        return inspect.getsourcefile(function)
    from airflow.sdk.definitions._internal.contextmanager import DagContext

    dag = arguments.get("dag") or DagContext.get_current()
    return getattr(dag, "fileloc", None)


# ------------------------------------------------------------------ how a try runs
class RunOptions(NamedTuple):
    """How a try runs, settled (a :class:`~.spec.TaskSpec`'s fields of the same names)."""

    checkpoint: Any  # None (the default root), False (none), a template, or a checked path or URI
    resume: bool
    deferrable: bool
    durable: bool
    wait_timeout: float | None
    right_size: bool


def run_options(owner: str, given: Mapping[str, Any]) -> RunOptions:
    """How a try runs, checked: each of :data:`RUN_OPTIONS`.

    ``right_size``'s backend is checked where the spec meets it (``_on_backend``); ``deferrable``'s default is
    ``[operators] default_deferrable``; ``reattach`` is ``durable``'s deprecated name.
    """
    from airflow_gpu_provider.checkpoint.location import check_root

    checkpoint = check_root(owner, "checkpoint", given.get("checkpoint"))
    if isinstance(checkpoint, str) and not is_template(checkpoint):  # a templated root: when it is rendered
        from airflow_gpu_provider.policy import Policy
        from airflow_gpu_provider.policy.checkpoints import check_root as permitted

        permitted(owner, "checkpoint", checkpoint, Policy.current())
    resume = given.get("resume")
    if resume is not None and (not isinstance(resume, bool) or (resume and checkpoint is False)):
        why = "a task without a checkpoint folder has nothing to resume" if resume is True else "expected a boolean"
        raise InvalidSettingError(owner, "resume", resume, why, "True or False (with checkpoint= not False)")
    deferrable = given.get("deferrable")
    if deferrable is None:
        deferrable, notice = config.default_deferrable()
        if notice is not None:
            from airflow_gpu_provider.dag_line import warn

            warn(notice, owner)
    return RunOptions(
        checkpoint,
        bool(resume),
        _boolean(owner, "deferrable", deferrable),
        _durable(owner, given.get("durable"), given.get("reattach")),
        _seconds(owner, given.get("wait_timeout")),
        _boolean(owner, "right_size", False if given.get("right_size") is None else given["right_size"]),
    )


def _durable(owner: str, durable: object, reattach: object) -> bool:
    """``durable`` (default ``True``); ``reattach``, its name before, still read for one release, with a warning."""
    if reattach is not None:
        from airflow_gpu_provider.dag_line import warn

        _boolean(owner, "reattach", reattach)
        if durable is not None and durable != reattach:
            raise InvalidSettingError(owner, "reattach", reattach, f"it contradicts durable={durable!r}", "durable=")
        warn(f"reattach={reattach!r} is deprecated: write durable={reattach!r}, Airflow's name for it", owner)
    return _boolean(owner, "durable", next((v for v in (durable, reattach) if v is not None), True))


def _boolean(owner: str, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidSettingError(owner, field, value, "not a boolean", _BOOLEAN)
    return value


def _seconds(owner: str, value: Any) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 10**9:
        raise InvalidSettingError(
            owner, "wait_timeout", value, "not a positive number of seconds", "seconds (at most 1e9) or a timedelta"
        )
    return float(seconds)


# ------------------------------------------------------------------ the payload
def check_payload(owner: str, arguments: Mapping[str, Any], *, complete: bool = True) -> ShippedCallable | None:
    """The function (its source shipped, its call bound to its signature) or the command, checked.

    Returns the function's shipped form (``None`` for a command).

    :param complete: the call is whole (a task's); ``False``: ``.partial()``, whose ``.expand()`` may add the rest
    """
    from airflow_gpu_provider.task.call import check_call_arguments
    from airflow_gpu_provider.task.callable import check_command, shipped_callable

    function, command = arguments.get("python_callable"), arguments.get("command")
    both = function is not None and command is not None
    if both or (complete and function is None and command is None):
        why = "give exactly one of them, not both" if both else "give exactly one of them"
        raise InvalidSettingError(owner, "python_callable/command", command, why, "python_callable=f or command=[...]")
    if command is not None and not is_template(command):
        check_command(owner, command)
    if function is None:
        return None
    shipped = shipped_callable(function, owner=owner)
    op_args, op_kwargs = arguments.get("op_args") or [], arguments.get("op_kwargs") or {}
    if complete or op_args or op_kwargs:  # no arguments yet, and more may come: nothing to bind
        check_call_arguments(owner, function, op_args, op_kwargs, shipped.signature, complete=complete)
    return shipped
