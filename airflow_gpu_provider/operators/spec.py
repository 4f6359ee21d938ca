"""One GPU task, settled once: :class:`TaskSpec`.

Every argument a GPU task takes is declared on its operator (so ``.partial()`` and ``.expand()`` take each one) and
settled here, once, when the DAG is parsed: by the operator's ``__init__``, its ``.partial()`` and ``@task.gpu``
(:meth:`GpuStepOperator.settle <airflow_gpu_provider.operators.gpu_step.GpuStepOperator.settle>` calls
:meth:`TaskSpec.settle`). Resources with their shortcuts, the image, the backend and its typed options, what the
backend can run, ``on_missing_gpu``, the ``on_oom`` ladder, how a try runs (``checkpoint``, ``resume``,
``deferrable``, ``durable``, ``wait_timeout``), the shipped ``modules``, and where the task is placed (its GPU
pool; on the executor backend its queue, executor or pod). Each check is in :mod:`.arguments`; an error names the
task, the field, the value and the accepted forms. What a template leaves open is settled when the task starts
(:meth:`TaskSpec.rendered`), checking only what the templates changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from airflow_gpu_provider import config
from airflow_gpu_provider.backends import BACKENDS, BackendInfo
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.operators import arguments as check
from airflow_gpu_provider.operators.arguments import IMAGE_SHORTCUTS, RESOURCE_SHORTCUTS, RUN_OPTIONS, is_template
from airflow_gpu_provider.pools import placement as pools
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task import missing_gpu

if TYPE_CHECKING:
    from airflow_gpu_provider.backends.options import BackendOptions
    from airflow_gpu_provider.settings.escalation import OomEscalation
    from airflow_gpu_provider.task.callable import ShippedCallable
    from airflow_gpu_provider.task.missing_gpu import OnMissingGpu
    from airflow_gpu_provider.task.modules import ProjectModules

__all__ = ["IMAGE_SHORTCUTS", "RESOURCE_SHORTCUTS", "SETTINGS", "TaskSpec", "beside_spec", "is_template",
           "owner_name", "task_owner"]  # fmt: skip

_NONE: Mapping[str, Any] = MappingProxyType({})  # an empty mapping no one can change: a default of TaskSpec
#: Every argument that :meth:`TaskSpec.settle` reads: a settled spec is settled again only if one of them changes.
SETTINGS: frozenset[str] = frozenset(
    {*RESOURCE_SHORTCUTS, *IMAGE_SHORTCUTS, *RUN_OPTIONS, "resources", "image", "backend", "backend_options"}
    | {"on_missing_gpu", "on_oom", "modules"}
)
#: What an operator keeps beside its spec: what a template may set, and what a copy of the operator shows.
_KEPT = frozenset({"backend", "on_missing_gpu", "backend_options", "on_oom"})


def beside_spec(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments an operator takes beside its settled ``task_spec``: the spec holds the rest.

    What a template may set (``backend``, ``on_missing_gpu``) and what a copy of the operator shows
    (``backend_options``, ``on_oom``) stay; ``resources=`` in particular must not reach Airflow, which reads it as
    its own ``BaseOperator(resources=...)`` when it maps a task.
    """
    return {key: value for key, value in kwargs.items() if key not in SETTINGS or key in _KEPT}


def owner_name(kind: str, task_id: object) -> str:
    """The task as its author wrote it, for errors: ``GpuStepOperator('train')``, ``@task.gpu('train')``.

    The one builder of the name every error of a task starts with (:func:`task_owner`, the decorator's).
    """
    return f"{kind}({'?' if task_id is None else task_id!r})"


def task_owner(operator: object, *_: Any, **kwargs: Any) -> str:
    """The task as its author wrote it, for errors: ``GpuStepOperator('train')``, or the decorator's (settled).

    :param operator: the operator, or its class (``.partial()``); ``kwargs``: the arguments it was given
    """
    spec, name = kwargs.get("task_spec"), (operator if isinstance(operator, type) else type(operator)).__name__
    return spec.owner if isinstance(spec, TaskSpec) else owner_name(name, kwargs.get("task_id"))


class TaskSpec(NamedTuple):
    """A GPU task as settled when the DAG is parsed; templated fields are settled when it starts.

    :param owner: the task as its author wrote it, for errors: ``@task.gpu('train')``, ``GpuStepOperator('train')``
    :param resources: the task's resources, with the concrete shortcuts applied and checked
    :param templated: the templated resource shortcuts, applied when the task starts
    :param backend: the backend's name; ``None`` while it is a template (``backend="{{ params.backend }}"``)
    :param options: the backend's typed options (``None`` with a templated backend)
    :param backend_options: the options as given, for a backend chosen by a template
    :param on_missing_gpu: the policy; ``None`` while it is a template
    :param checkpoint: the checkpoint root as given and checked (``None``: the default; ``False``: none)
    :param resume: each try resumes from the newest checkpoint of its folder
    :param deferrable: a try runs deferred where its backend can (a wait for GPUs, on every host backend)
    :param durable: a later try takes over the job an earlier try left running
    :param wait_timeout: seconds a wait for GPUs lasts (``None``: ``[gpu] wait_timeout``)
    :param right_size: a try asks for the smallest GPU that held the last successful run's peak memory
    :param modules: the project modules shipped with the task
    :param launch: ``accelerate launch``'s options (AccelerateOperator's), checked by accelerate's parser
    :param shipped: the function's shipped form (``None``: a command), set by the operator's ``settle``
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
    checkpoint: Any = None
    resume: bool = False
    deferrable: bool = False
    durable: bool = True
    wait_timeout: float | None = None
    right_size: bool = False
    modules: ProjectModules | None = None
    launch: Mapping[str, Any] | None = None
    shipped: ShippedCallable | None = None
    inputs: Mapping[str, Any] = _NONE

    @classmethod
    def settle(cls, owner: str, arguments: Mapping[str, Any], *, num_nodes: int = 1) -> TaskSpec:
        """Settle a task from its arguments (every key of :data:`SETTINGS` is optional).

        ``python_callable`` and ``dag`` say where the DAG file is, for ``modules``.

        :raises InvalidSettingError: for anything the task could never run with
        """
        given = {key: value for key, value in arguments.items() if key in SETTINGS}
        with check.named(owner):
            resources, templated = check.resources_of(owner, given)
            image = check.image_of(owner, given)
        check.check_accelerator(owner, resources)
        backend = given.get("backend")
        backend = config.get("backend") if backend is None else backend  # no backend: [gpu] backend runs the task
        spec = cls(
            owner,
            resources,
            image,
            templated,
            on_missing_gpu=check.policy_of(owner, given),
            backend_options=check.backend_options_of(owner, given),
            on_oom=check.on_oom_of(owner, given, resources, templated),
            num_nodes=num_nodes,
            modules=check.modules_of(owner, given, arguments),
            inputs=given,
            **check.run_options(owner, given)._asdict(),
        )
        if not is_template(backend):
            spec = spec._on_backend(str(backend))
        check_deferrable(spec)
        return spec

    def _on_backend(self, name: str) -> TaskSpec:
        """The spec on backend ``name``: its options parsed, and what it cannot run refused."""
        info = BACKENDS[config.check_choice(self.owner, "backend", name, tuple(BACKENDS))]
        options = info.parse_options(self.backend_options)
        info.check(None if self.templated else self.resources, self.num_nodes, options, self.image)
        options.permitted(self.owner)
        refused = info.right_size_refused(self.resources.share is not None) if self.right_size else None
        if refused is not None:
            raise InvalidSettingError(self.owner, "right_size", True, *refused)
        return self._replace(backend=name, options=options)

    def changed(self, arguments: Mapping[str, Any], *, num_nodes: int | None = None) -> TaskSpec:
        """The spec with some arguments given again (``.override()``, a mapped value): settled again if one differs.

        An argument given as ``None`` is not given (the operator's own default is ``None`` for each).
        """
        changes = {key: value for key, value in arguments.items() if key in SETTINGS and value is not None}
        nodes = self.num_nodes if num_nodes is None else num_nodes
        if all(self.inputs.get(key, None) is value for key, value in changes.items()) and nodes == self.num_nodes:
            return self
        spec = TaskSpec.settle(self.owner, {**arguments, **self.inputs, **changes}, num_nodes=nodes)
        return spec._replace(launch=self.launch)

    @property
    def info(self) -> BackendInfo:
        """The backend's registry entry (settled specs only)."""
        assert self.backend is not None, "the backend is a template until the task starts"
        return BACKENDS[self.backend]

    @property
    def starts_in_triggerer(self) -> bool:
        """Whether it waits for its host's GPUs in the triggerer (``start_from_trigger``; 3.3.2 queues no such one)."""
        from airflow import __version__
        from airflow.configuration import conf
        from packaging.version import Version

        wanted = self.deferrable and self.on_missing_gpu == "wait" and self.backend and not self.templated
        if not wanted or Version(Version(__version__).base_version) < Version("3.3") or not self.info.host_gpus:
            return False
        local = self.resources.requests_gpus and getattr(self.options, "engine_is_local", True)
        return bool(local) and not conf.getboolean("triggerer", "queues_enabled", fallback=False)

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
        overrides: Mapping[str, Any] | None,
        environment: Mapping[str, str] | None,
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
            with check.named(self.owner):
                rendered = overrides or {}
                resources = self.resources.with_overrides(**{k: rendered.get(k, v) for k, v in self.templated.items()})
            check.check_accelerator(self.owner, resources)
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
        check_deferrable(spec)
        return spec

    def on(self, backend: str) -> TaskSpec:
        """The settled spec on another backend (``render_manifests(backend=...)``)."""
        return self if backend == self.backend else self._on_backend(backend)


ACCEPTED_BACKENDS = (
    "backend='docker', 'kubernetes', 'ray' or 'slurm' (or on_missing_gpu='wait', to defer only the wait for GPUs)"
)


def check_deferrable(spec: TaskSpec) -> None:
    """Refuse a ``deferrable=True`` given where nothing could be deferred (at parse; a templated backend: started).

    Airflow's ``[operators] default_deferrable`` defers what it can and runs the rest in the worker.
    """
    if not spec.deferrable or spec.inputs.get("deferrable") is None or spec.backend is None or spec.info.defers:
        return
    if spec.on_missing_gpu is None or spec.on_missing_gpu == "wait":
        return  # a wait for GPUs is deferred (a templated on_missing_gpu is checked when rendered)
    raise InvalidSettingError(
        spec.owner,
        "deferrable",
        True,
        f"the {spec.backend!r} backend runs the task as a child of its worker, which cannot outlive the worker: only "
        "a wait for GPUs can be deferred there",
        ACCEPTED_BACKENDS,
    )


def _load(path: str) -> Any:
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)
