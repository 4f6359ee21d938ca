"""One GPU task, settled once: :class:`TaskSpec`.

The operator's ``__init__`` and the decorator (mapped tasks too, and the classic operator's ``.partial()``) settle a
task when the DAG is parsed: resources with their shortcuts, the image, the backend and its typed options, what the
backend can run, ``on_missing_gpu``, the ``on_oom`` ladder, and where the task is placed (its GPU pool; on the
executor backend its queue, executor or pod). Every check happens here, once; an error names the task, the field, the
value and the accepted forms. What a template leaves open is settled when the task starts (:meth:`TaskSpec.rendered`),
checking only what the templates changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from airflow_gpu_provider import config
from airflow_gpu_provider.backends import BACKENDS, BackendInfo
from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError
from airflow_gpu_provider.pools import placement as pools
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task import missing_gpu

if TYPE_CHECKING:
    from airflow_gpu_provider.backends.options import BackendOptions
    from airflow_gpu_provider.settings.escalation import OomEscalation
    from airflow_gpu_provider.task.missing_gpu import OnMissingGpu

_NONE: Mapping[str, Any] = MappingProxyType({})  # an empty mapping no one can change: a default of TaskSpec
#: The resource fields a task may give one by one (``gpu_count=2``) instead of a whole ``ResourceSettings``.
RESOURCE_SHORTCUTS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ResourceSettings))
#: The image fields a task may give one by one (``requirements=[...]``).
IMAGE_SHORTCUTS: tuple[str, ...] = ("parent_image", "requirements", "python_package_installer")
#: Every argument that :meth:`TaskSpec.settle` reads: a settled spec is settled again only if one of them changes.
SETTINGS: frozenset[str] = frozenset(
    {*RESOURCE_SHORTCUTS, *IMAGE_SHORTCUTS, "resources", "image", "backend", "backend_options", "on_missing_gpu"}
    | {"on_oom"}
)


def beside_spec(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments an operator takes beside its settled ``task_spec``: the spec holds resources and image.

    What a template may set (``backend``, ``on_missing_gpu``) and what a copy of the operator shows
    (``backend_options``, ``on_oom``) stay; ``resources=`` in particular must not reach Airflow, which reads it as
    its own ``BaseOperator(resources=...)`` when it maps a task.
    """
    kept = {"backend", "on_missing_gpu", "backend_options", "on_oom"}
    return {key: value for key, value in kwargs.items() if key not in SETTINGS or key in kept}


def task_owner(operator: object, *_: Any, **kwargs: Any) -> str:
    """The task as its author wrote it, for errors: ``GpuStepOperator('train')``, or the decorator's (settled).

    :param operator: the operator, or its class (``.partial()``); ``kwargs``: the arguments it was given
    """
    spec, name = kwargs.get("task_spec"), (operator if isinstance(operator, type) else type(operator)).__name__
    return spec.owner if isinstance(spec, TaskSpec) else f"{name}({kwargs.get('task_id', '?')!r})"


def is_template(value: object) -> bool:
    """Whether a value is a Jinja template to be rendered when the task runs."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


class TaskSpec(NamedTuple):
    """A GPU task as settled when the DAG is parsed; templated fields are settled when it starts.

    :param owner: the task as its author wrote it, for errors: ``@task.gpu('train')``, ``GpuStepOperator('train')``
    :param resources: the task's resources, with the concrete shortcuts applied and checked
    :param templated: the templated resource shortcuts, applied when the task starts
    :param backend: the backend's name; ``None`` while it is a template (``backend="{{ params.backend }}"``)
    :param options: the backend's typed options (``None`` with a templated backend)
    :param backend_options: the options as given, for a backend chosen by a template
    :param on_missing_gpu: the policy; ``None`` while it is a template
    :param inputs: the arguments the spec was settled from (a changed one settles it again)

    A named tuple rather than a dataclass: it is built for every task of every DAG parse, and a dataclass costs
    more to define than most of what a task does at parse.
    """

    owner: str
    resources: ResourceSettings
    image: ImageSettings
    templated: Mapping[str, Any] = _NONE
    backend: str | None = None
    options: BackendOptions | None = None
    backend_options: Mapping[str, Any] = _NONE
    on_missing_gpu: OnMissingGpu | None = None
    on_oom: OomEscalation | None = None
    num_nodes: int = 1
    inputs: Mapping[str, Any] = _NONE

    @classmethod
    def settle(cls, owner: str, arguments: Mapping[str, Any], *, num_nodes: int = 1) -> TaskSpec:
        """Settle a task from its arguments (every key of :data:`SETTINGS` is optional).

        :raises InvalidSettingError: for anything the task could never run with
        """
        given = {key: value for key, value in arguments.items() if key in SETTINGS}
        with _named(owner):
            resources, templated = _resources(owner, given.get("resources"), given)
            image = _image(owner, given.get("image"), given)
        check_accelerator(owner, resources)
        policy = given.get("on_missing_gpu")
        if policy is None:
            policy = config.get("on_missing_gpu")
        if not is_template(policy):
            config.check_choice(owner, "on_missing_gpu", policy, missing_gpu.NAMES)
        backend_options = given.get("backend_options")
        if backend_options is not None and not isinstance(backend_options, Mapping):
            raise InvalidSettingError(
                owner, "backend_options", backend_options, "expected a mapping of option names to values",
                "a dict such as {'namespace': 'ml'}",
            )  # fmt: skip
        backend = given.get("backend")
        backend = config.get("backend") if backend is None else backend  # no backend: [gpu] backend runs the task
        spec = cls(
            owner,
            resources,
            image,
            templated,
            on_missing_gpu=None if is_template(policy) else policy,
            backend_options=dict(backend_options or {}),
            num_nodes=num_nodes,
            inputs=given,
        )
        if not is_template(backend):
            spec = spec._on_backend(str(backend))
        on_oom = given.get("on_oom")
        if on_oom is not None:  # the ladder's module loads only for tasks that have one
            from airflow_gpu_provider.settings.escalation import OomEscalation
        if on_oom is not None and not isinstance(on_oom, OomEscalation):
            raise InvalidSettingError(
                owner, "on_oom", on_oom, "expected an OomEscalation", "OomEscalation(accelerators=['L4', 'A100-80GB'])"
            )
        if on_oom is not None and not templated:  # templated resources are checked when rendered
            on_oom.check(resources, owner=owner)
        return spec._replace(on_oom=on_oom)

    def _on_backend(self, name: str) -> TaskSpec:
        """The spec on backend ``name``: its options parsed, and what it cannot run refused."""
        info = BACKENDS[config.check_choice(self.owner, "backend", name, tuple(BACKENDS))]
        options = info.parse_options(self.backend_options)
        info.check(None if self.templated else self.resources, self.num_nodes, options, self.image)
        options.permitted(self.owner)
        return self._replace(backend=name, options=options)

    def changed(self, arguments: Mapping[str, Any], *, num_nodes: int | None = None) -> TaskSpec:
        """The spec with some arguments given again (``.override()``, a mapped value): settled again if one differs."""
        changes = {key: value for key, value in arguments.items() if key in SETTINGS}
        nodes = self.num_nodes if num_nodes is None else num_nodes
        if all(self.inputs.get(key, None) is value for key, value in changes.items()) and nodes == self.num_nodes:
            return self
        return TaskSpec.settle(self.owner, {**self.inputs, **changes}, num_nodes=nodes)

    @property
    def info(self) -> BackendInfo:
        """The backend's registry entry (settled specs only)."""
        assert self.backend is not None, "the backend is a template until the task starts"
        return BACKENDS[self.backend]

    # ------------------------------------------------------------------ placement, at DAG parse
    def placed(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` with the GPU pool and, on a backend that Airflow's executor places, its queue/executor/pod."""
        if self.backend is not None and self.info.placement is not None:
            place = _load(self.info.placement)
            kwargs = place(
                self.owner,
                self.resources,
                self.templated,
                self.options,
                kwargs,
                default_executor=config.get("executor"),
                default_queue=config.get("queue"),
            )
        pool = None
        if "pool" not in kwargs and (self.resources.requests_gpus or "gpu_count" in self.templated):
            template = config.get("pool") or ""
            if "accelerator" in self.templated and "{" in template:
                raise InvalidSettingError(
                    self.owner,
                    "accelerator",
                    self.templated["accelerator"],
                    f"[gpu] pool {template!r} has a pool per worker class, chosen when the DAG is parsed, and a "
                    "template is rendered only when the task runs",
                    "a concrete accelerator, or a [gpu] pool without {accelerator} and {queue}",
                )
            pool = pools.pool_for(self.owner, self.resources, kwargs.get("queue"))
        return pools.with_gpu_pool(self.resources, self.templated, kwargs, pool=pool)

    # ------------------------------------------------------------------ when the task starts
    def rendered(
        self,
        *,
        backend: str | None,
        on_missing_gpu: str | None,
        overrides: Mapping[str, Any],
        environment: Mapping[str, str],
    ) -> TaskSpec:
        """The spec once templates are rendered: only what a template gave is checked (the rest was, at parse).

        :param backend: the rendered ``backend`` argument (``None``: as settled)
        :param on_missing_gpu: the rendered ``on_missing_gpu`` argument (``None``: as settled)
        :param overrides: the rendered templated resource shortcuts
        :param environment: the task's environment variables (rendered), over the image's
        """
        spec = self
        if environment:
            image = dataclasses.replace(self.image, environment={**self.image.environment, **environment})
            spec = spec._replace(image=image)
        if self.templated:
            with _named(self.owner):
                resources = self.resources.with_overrides(**{k: overrides.get(k, v) for k, v in self.templated.items()})
            check_accelerator(self.owner, resources)
            spec = spec._replace(resources=resources, templated=_NONE)
            if spec.on_oom is not None:
                spec.on_oom.check(resources, owner=self.owner)
        if spec.on_missing_gpu is None:
            policy = config.check_choice(self.owner, "on_missing_gpu", on_missing_gpu, missing_gpu.NAMES)
            spec = spec._replace(on_missing_gpu=cast("OnMissingGpu", policy))
        if spec.backend is None:
            spec = spec._on_backend(str(backend))
        elif self.templated:
            spec.info.check(spec.resources, spec.num_nodes, cast("BackendOptions", spec.options), spec.image)
        return spec

    def on(self, backend: str) -> TaskSpec:
        """The settled spec on another backend (``render_manifests(backend=...)``)."""
        return self if backend == self.backend else self._on_backend(backend)


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


@contextlib.contextmanager
def _named(owner: str) -> Iterator[None]:
    """Errors of the settings a task was given name the task (``@task.gpu('train')``), not the settings class."""
    try:
        yield
    except UnknownSettingError:
        raise
    except InvalidSettingError as err:
        if err.owner in ("ResourceSettings", "ImageSettings"):
            raise InvalidSettingError(owner, err.field, err.value, err.reason, err.accepted) from None
        raise


def _resources(owner: str, resources: object, given: Mapping[str, Any]) -> tuple[ResourceSettings, dict[str, Any]]:
    """The resources with the concrete shortcuts applied (checked); the templated shortcuts apart."""
    if resources is not None and not isinstance(resources, ResourceSettings):
        raise InvalidSettingError(owner, "resources", resources, "expected a ResourceSettings", None)
    shortcuts = {name: given[name] for name in RESOURCE_SHORTCUTS if given.get(name) is not None}
    templated = {name: value for name, value in shortcuts.items() if is_template(value)}
    concrete = {name: value for name, value in shortcuts.items() if name not in templated}
    settings = resources or ResourceSettings()
    return (settings.with_overrides(**concrete) if concrete else settings), templated


def _image(owner: str, image: object, given: Mapping[str, Any]) -> ImageSettings:
    """The image with its shortcuts applied (checked)."""
    if image is not None and not isinstance(image, ImageSettings):
        raise InvalidSettingError(owner, "image", image, "expected an ImageSettings", None)
    changes = {name: given[name] for name in IMAGE_SHORTCUTS if given.get(name) is not None}
    image = image or ImageSettings()
    return dataclasses.replace(image, **changes) if changes else image


def _load(path: str) -> Any:
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)
