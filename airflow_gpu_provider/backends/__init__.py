"""THE registry of backends: name -> where its two halves live, the pip extra it needs, what it can do.

Every backend is one package here, with two halves:

- ``options.py``: its ``backend_options`` as a typed, frozen :class:`~.options.BackendOptions`, parsed and checked
  when the DAG is parsed. Pure and cheap: DAG parsing imports only this half (and, for a backend that Airflow's
  executor places, its ``placement``).
- ``backend.py``: the :class:`~.base.Backend` that plans and runs a task, with the backend's own dependencies.
  Imported only when a task runs or is rendered; a missing dependency names the pip extra.

Shared by several backends, and not backends themselves: ``base.py``, ``options.py`` and ``pods/`` (the pure pod
mapping of the kubernetes and executor backends).

Adding a backend is one folder and one entry in :data:`BACKENDS` (docs/architecture.md shows it). A backend may run
its tasks with another backend's run half (``executor`` runs like ``local``): its entry names that class.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_gpu_provider.exceptions import InvalidSettingError, MissingDependencyError
from airflow_gpu_provider.settings import ALL_GPUS, ImageSettings, ResourceSettings

if TYPE_CHECKING:
    from airflow_gpu_provider.backends.base import Backend
    from airflow_gpu_provider.backends.options import BackendOptions


class BackendInfo(NamedTuple):
    """One backend.

    :param backend: ``module:Class`` of its :class:`~.base.Backend`
    :param options: ``module:Class`` of its :class:`~.options.BackendOptions`
    :param extra: the pip extra that installs its dependencies (``None``: the core install has them)
    :param max_nodes: machines one task try may span (``None``: any number)
    :param all_gpus: whether ``gpu_count="all"`` means something there
    :param renders: whether it can show what it would submit (``GpuStepOperator.render_manifests()``)
    :param placement: ``module:function`` that places a task of this backend when the DAG is parsed (queue,
        executor, ``executor_config``), for a backend whose tasks Airflow's executor places; ``None``: none
    :param defers: whether a running task can be deferred (``deferrable=True``: :meth:`.base.Backend.start`); a
        backend whose task is a child of the worker cannot (it defers only the wait for GPUs)
    :param gpu_shares: whether a share of one GPU (``gpu_count=0.5``, ``gpu_share="8GiB"``) means something there
    :param host_gpus: whether its GPUs come from the worker host's allocator (a deferred wait for them may start in
        the triggerer: ``host/trigger.py`` ``start_args``)
    :param right_sizes: what ``right_size=True`` sizes there from the last successful run's peak: ``"gpus"`` (the
        smallest of a host's GPUs that holds it), ``"shares"`` (a share of one GPU of that size)
    :param avoids_nodes: whether it places its work on a cluster's nodes: the next try avoids the node where an
        earlier one failed because of the infrastructure (``TaskRequest.avoid_nodes``)
    :param summary: where it runs a task, in a few words (the provider's description, the trigger form)
    """

    name: str
    backend: str
    options: str
    extra: str | None = None
    max_nodes: int | None = 1
    all_gpus: bool = True
    renders: bool = False
    placement: str | None = None
    defers: bool = False
    gpu_shares: bool = False
    host_gpus: bool = False
    right_sizes: tuple[str, ...] = ()
    avoids_nodes: bool = False
    summary: str = ""

    @property
    def placed_at_parse(self) -> bool:
        """Whether Airflow's executor places its tasks when the DAG is parsed: a template cannot choose it."""
        return self.placement is not None

    def right_size_refused(self, share: bool) -> tuple[str, str] | None:
        """Why ``right_size=True`` means nothing here for whole GPUs (or a ``share``), and where it does."""
        sized = "shares" if share else "gpus"
        if sized in self.right_sizes:
            return None
        where = {
            kind: " or ".join(repr(n) for n, i in BACKENDS.items() if kind in i.right_sizes)
            for kind in ("gpus", "shares")
        }
        what = "a share of one GPU" if share else "whole GPUs"
        accepted = f"right_size=True with whole GPUs on {where['gpus']}, with a share of one GPU on {where['shares']}"
        return f"backend {self.name!r} does not size {what} from the last successful run's peak", accepted

    def options_class(self) -> type[BackendOptions]:
        """The options half (cheap to import)."""
        return _load(self.options)

    def backend_class(self) -> type[Backend[Any, Any]]:
        """The run half, naming the pip extra when its dependencies are missing."""
        try:
            return _load(self.backend)
        except ImportError as err:
            if self.extra is None:
                raise
            raise MissingDependencyError(f"The {self.name!r} backend ({err.name})", self.extra) from err

    def parse_options(self, options: Mapping[str, Any] | BackendOptions | None) -> BackendOptions:
        """The typed options (parsed from a mapping, or as given)."""
        options_class = self.options_class()
        if isinstance(options, options_class):
            return options
        if not options and (options is None or isinstance(options, Mapping)):
            return _defaults(options_class)  # type: ignore[arg-type]  # a class is hashable (mypy reads the instances')
        return options_class.parse(options)  # type: ignore[arg-type]  # a mapping

    def check(
        self,
        resources: ResourceSettings | None,
        num_nodes: int,
        options: BackendOptions,
        image: ImageSettings | None = None,
    ) -> None:
        """Reject, before anything starts, what this backend cannot run: too many machines, "all" GPUs, ...

        :param resources: ``None`` while they are templated (checked again when rendered)
        """
        if image is not None:
            options.check_image(image)
        if self.max_nodes is not None and num_nodes > self.max_nodes:
            spanning = [b.name for b in BACKENDS.values() if b.max_nodes is None or b.max_nodes >= num_nodes]
            raise InvalidSettingError(
                f"backend {self.name!r}",
                "num_machines",
                num_nodes,
                f"backend {self.name!r} runs on "
                + ("one machine" if self.max_nodes == 1 else f"{self.max_nodes} machines"),
                f"num_machines={self.max_nodes}, or a backend that spans machines: {' or '.join(map(repr, spanning))}",
            )
        if resources is None:
            return
        if resources.gpu_count == ALL_GPUS and not self.all_gpus:
            able = " and ".join(b.name for b in BACKENDS.values() if b.all_gpus)
            raise InvalidSettingError(
                "ResourceSettings",
                "gpu_count",
                ALL_GPUS,
                f"the {self.name} backend asks for a number of GPUs; 'all' works only on the {able} backends",
                "an integer such as gpu_count=8",
            )
        if resources.share is not None and not self.gpu_shares:
            able = ", ".join(b.name for b in BACKENDS.values() if b.gpu_shares)
            field = "gpu_share" if resources.gpu_share is not None else "gpu_count"
            raise InvalidSettingError(
                "ResourceSettings",
                field,
                getattr(resources, field),
                f"the {self.name} backend gives a task whole GPUs; a share of one works on the {able} backends",
                "a whole number such as gpu_count=1",
            )
        if resources.share is not None and self.host_gpus and resources.gpu_vendor.name != "nvidia":
            why = f"the {self.name} backend shares NVIDIA GPUs only (MPS or PyTorch's CUDA cap enforce a share)"
            raise InvalidSettingError("ResourceSettings", "gpu_vendor", resources.gpu_vendor.name, why, "'nvidia'")
        options.check(resources)

    def create(self, options: Mapping[str, Any] | BackendOptions | None = None, log: Any = None) -> Backend[Any, Any]:
        """A backend instance for these options."""
        return self.backend_class()(self.parse_options(options), log or logging.getLogger(__name__))


@functools.cache
def _defaults(options_class: type[BackendOptions]) -> BackendOptions:
    """A backend's default options, parsed once per process (they are frozen): most tasks give none."""
    return options_class.parse({})


def _load(path: str) -> Any:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


BACKENDS: dict[str, BackendInfo] = {
    info.name: info
    for info in (
        BackendInfo(
            "local",
            backend="airflow_gpu_provider.backends.local.backend:LocalBackend",
            options="airflow_gpu_provider.backends.local.options:LocalOptions",
            gpu_shares=True,
            host_gpus=True,
            right_sizes=("gpus", "shares"),
            summary="a child process of the worker",
        ),
        BackendInfo(
            "docker",
            backend="airflow_gpu_provider.backends.docker.backend:DockerBackend",
            options="airflow_gpu_provider.backends.docker.options:DockerOptions",
            extra="docker",
            defers=True,
            gpu_shares=True,
            host_gpus=True,
            right_sizes=("gpus", "shares"),
            summary="a container on a Docker engine",
        ),
        BackendInfo(
            "kubernetes",
            backend="airflow_gpu_provider.backends.kubernetes.backend:KubernetesBackend",
            options="airflow_gpu_provider.backends.kubernetes.options:KubernetesOptions",
            extra="kubernetes",
            max_nodes=None,
            all_gpus=False,
            renders=True,
            defers=True,
            avoids_nodes=True,
            summary="a pod, or an Indexed Job across nodes",
        ),
        BackendInfo(
            "ray",
            backend="airflow_gpu_provider.backends.ray.backend:RayBackend",
            options="airflow_gpu_provider.backends.ray.options:RayOptions",
            extra="ray",
            max_nodes=None,
            all_gpus=False,
            defers=True,
            gpu_shares=True,
            summary="a Ray job",
        ),
        BackendInfo(
            "slurm",
            backend="airflow_gpu_provider.backends.slurm.backend:SlurmBackend",
            options="airflow_gpu_provider.backends.slurm.options:SlurmOptions",
            max_nodes=None,
            all_gpus=False,
            defers=True,
            gpu_shares=True,
            right_sizes=("shares",),
            avoids_nodes=True,
            summary="a Slurm batch job, on one node or several",
        ),
        # Airflow's executor places the task when the DAG is parsed (backends/executor/placement.py); on the GPU
        # worker, pod or queue it was given, it runs exactly as the local backend runs it: the local run half.
        BackendInfo(
            "executor",
            backend="airflow_gpu_provider.backends.local.backend:LocalBackend",
            options="airflow_gpu_provider.backends.executor.options:ExecutorOptions",
            placement="airflow_gpu_provider.backends.executor.placement:place",
            summary="a task that Airflow's executor places, chosen when the DAG is parsed",
        ),
    )
}
#: The backends a template (``backend="{{ params.backend }}"``) may choose when the task runs.
RUN_TIME_NAMES: tuple[str, ...] = tuple(name for name, info in BACKENDS.items() if not info.placed_at_parse)


def describe_backends(names: tuple[str, ...] | None = None) -> str:
    """The backends of the registry in words: ``'local' (a child process of the worker), 'docker' (...) ...``.

    :param names: those to describe (default: every one)
    """
    described = [
        f"{name!r} ({BACKENDS[name].summary})" if BACKENDS[name].summary else repr(name) for name in names or BACKENDS
    ]
    return ", ".join(described[:-1]) + f" or {described[-1]}" if len(described) > 1 else "".join(described)
