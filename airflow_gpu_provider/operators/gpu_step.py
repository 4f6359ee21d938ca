"""``GpuStepOperator``: run a Python function or a command with the resources it declares, on any backend."""

from __future__ import annotations

import dataclasses
import inspect
import shlex
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_gpu_provider import config
from airflow_gpu_provider.backends import BACKENDS, BackendInfo
from airflow_gpu_provider.exceptions import InvalidSettingError, RemoteTaskError
from airflow_gpu_provider.payload import (
    call_arguments,
    callable_envelope,
    check_call_arguments,
    check_command,
    command_envelope,
    shipped_callable,
)
from airflow_gpu_provider.placement.place import place
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.settings.image import check_environment
from airflow_gpu_provider.task import missing_gpu
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.telemetry import report
from airflow_gpu_provider.telemetry.lineage import LineageMixin

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_gpu_provider.backends.base import Backend
    from airflow_gpu_provider.backends.options import BackendOptions

RESOURCE_SHORTCUTS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ResourceSettings))


def is_template(value: object) -> bool:
    """Whether a value is a Jinja template to be rendered when the task runs."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def resolve_resources(
    resources: ResourceSettings | None, shortcuts: Mapping[str, Any], *, owner: str
) -> tuple[ResourceSettings, dict[str, Any]]:
    """Apply the resource shortcuts to ``resources``: templated ones are returned apart, to apply when rendered.

    Settings are validated when they change only: ``resources`` alone comes back as it is.
    """
    if resources is not None and not isinstance(resources, ResourceSettings):
        raise InvalidSettingError(owner, "resources", resources, "expected a ResourceSettings", None)
    given = {k: v for k, v in shortcuts.items() if v is not None}
    overrides = {k: v for k, v in given.items() if is_template(v)}
    concrete = {k: v for k, v in given.items() if k not in overrides}
    settings = resources or ResourceSettings()
    return (settings.with_overrides(**concrete) if concrete else settings), overrides


def _argv(command: Sequence[str] | str) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else list(command)


class GpuStepOperator(LineageMixin, BaseOperator):
    """Run a Python callable or a command on GPUs, on the local, Docker or Kubernetes backend.

    Declare resources once (``resources=ResourceSettings(...)`` or the shortcuts) and the backend maps them:
    the local backend to devices from the host's GPU allocator, Docker to device requests, Kubernetes to
    resource limits and node selectors. The callable's source is shipped to the task process; arguments and the
    return value (pushed to XCom) travel as JSON.

    :param python_callable: function to run; it must import what it uses inside its body
    :param command: argument list (or a string split with ``shlex``; no shell) to run instead (templated)
    :param op_args: positional arguments for the callable (templated)
    :param op_kwargs: keyword arguments for the callable (templated)
    :param resources: the task's :class:`ResourceSettings`
    :param image: the task's :class:`ImageSettings`
    :param backend: a backend of :data:`airflow_gpu_provider.backends.BACKENDS` (``"local"``, ``"docker"``,
        ``"kubernetes"``); default ``[gpu] backend`` (templated)
    :param on_missing_gpu: ``"fail"``, ``"wait"`` or ``"cpu"``; default ``[gpu] on_missing_gpu`` (templated)
    :param backend_options: backend-specific options (connection ids, namespace, ...), checked at parse time
    :param environment: extra environment variables for the task process (templated)
    :param cpu_count: shortcut for ``resources.cpu_count`` (a template is validated when rendered); likewise
        ``gpu_count``, ``memory``, ``accelerator``, ``gpu_vendor``, ``mig_profile``, ``shm_size``
    :param requirements: shortcut for ``image.requirements``; likewise ``parent_image``,
        ``python_package_installer``
    """

    template_fields: Sequence[str] = (
        "op_args",
        "op_kwargs",
        "command",
        "backend",
        "on_missing_gpu",
        "environment",
        "resource_overrides",
    )
    template_fields_renderers = {
        "op_args": "py",
        "op_kwargs": "py",
        "environment": "json",
        "resource_overrides": "json",
    }
    num_nodes: int = 1  # machines one try runs on (AccelerateOperator's num_machines)
    rendezvous_port: int | None = None  # where a multi-node launch meets (AccelerateOperator's main_process_port)
    ui_color = "#76b900"
    ui_fgcolor = "#ffffff"

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any] | None = None,
        command: Sequence[str] | str | None = None,
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        resources: ResourceSettings | None = None,
        image: ImageSettings | None = None,
        backend: str | None = None,
        on_missing_gpu: str | None = None,
        backend_options: Mapping[str, Any] | None = None,
        environment: Mapping[str, str] | None = None,
        cpu_count: float | str | None = None,
        gpu_count: int | str | None = None,
        memory: int | str | None = None,
        accelerator: str | None = None,
        gpu_vendor: Any = None,
        mig_profile: str | None = None,
        shm_size: int | str | None = None,
        parent_image: str | None = None,
        requirements: Sequence[str] | None = None,
        python_package_installer: str | None = None,
        **kwargs: Any,
    ) -> None:
        owner = f"{type(self).__name__}({kwargs.get('task_id', '?')!r})"
        if (python_callable is None) == (command is None):
            raise InvalidSettingError(
                owner, "python_callable/command", None, "give exactly one of them", "python_callable=f or command=[...]"
            )
        if command is not None and not is_template(command):
            check_command(owner, command)
        if image is not None and not isinstance(image, ImageSettings):
            raise InvalidSettingError(owner, "image", image, "expected an ImageSettings", None)

        shortcuts = {
            "cpu_count": cpu_count,
            "gpu_count": gpu_count,
            "memory": memory,
            "accelerator": accelerator,
            "gpu_vendor": gpu_vendor,
            "mig_profile": mig_profile,
            "shm_size": shm_size,
        }
        self.resource_settings, self.resource_overrides = resolve_resources(resources, shortcuts, owner=owner)
        image = image or ImageSettings()
        image_shortcuts: dict[str, Any] = {
            "parent_image": parent_image,
            "requirements": requirements,
            "python_package_installer": python_package_installer,
        }
        image_changes = {k: v for k, v in image_shortcuts.items() if v is not None}
        self.image_settings = dataclasses.replace(image, **image_changes) if image_changes else image

        if on_missing_gpu is not None and not is_template(on_missing_gpu):
            config.check_choice(owner, "on_missing_gpu", on_missing_gpu, missing_gpu.NAMES)
        if backend_options is not None and not isinstance(backend_options, Mapping):
            raise InvalidSettingError(
                owner, "backend_options", backend_options, "expected a mapping of option names to values",
                "a dict such as {'namespace': 'ml'}",
            )  # fmt: skip
        self._backend_options: tuple[str, BackendOptions] | None = None  # parsed once, for the backend they are for
        chosen = config.get("backend") if backend is None else backend  # no backend: [gpu] backend runs the task
        if not is_template(chosen):
            info = BACKENDS[config.check_choice(owner, "backend", chosen, tuple(BACKENDS))]
            options = info.parse_options(backend_options)
            resources = None if self.resource_overrides else self.resource_settings
            info.check(resources, self.num_nodes, options, self.image_settings)
            self._backend_options = (info.name, options)

        self.python_callable = python_callable
        self.shipped = shipped_callable(python_callable, owner=owner) if python_callable is not None else None
        self.command = command
        if python_callable is not None:
            check_call_arguments(owner, python_callable, op_args or [], op_kwargs or {})
        self.op_args = list(op_args or [])
        self.op_kwargs = dict(op_kwargs or {})
        self.backend = backend
        self.on_missing_gpu = on_missing_gpu
        self.backend_options = dict(backend_options or {})
        self.environment = check_environment(owner, "environment", environment or {})
        self._running_backend: Backend[Any, Any] | None = None
        kwargs = place(owner, backend, backend_options, self.resource_settings, self.resource_overrides, kwargs)
        super().__init__(**kwargs)

    # ------------------------------------------------------------------ execution
    def build_envelope(self, context: Context, resources: ResourceSettings) -> dict[str, Any]:
        """The runtime envelope for this try, for these (rendered) resources; subclasses wrap the payload."""
        owner = f"{type(self).__name__}({self.task_id!r})"
        if self.shipped is None:
            return command_envelope(_argv(self.command or []))
        assert self.python_callable is not None
        args, kwargs = call_arguments(
            self.shipped, inspect.signature(self.python_callable), self.op_args, self.op_kwargs, context, owner=owner
        )
        return callable_envelope(self.shipped, args, kwargs)

    def resolved_request(
        self, context: Context, *, backend: str | None = None
    ) -> tuple[BackendInfo, BackendOptions, TaskRequest]:
        """The backend, its options and the backend-independent request, after templates are rendered.

        :param backend: a backend other than the task's own (``render_manifests``)
        """
        owner = f"{type(self).__name__}({self.task_id!r})"
        resources = self.resource_settings
        if self.resource_overrides:
            resources = resources.with_overrides(**self.resource_overrides)
        image = self.image_settings
        if self.environment:
            image = dataclasses.replace(image, environment={**image.environment, **self.environment})
        chosen = backend or self.backend or config.get("backend")
        info = BACKENDS[config.check_choice(owner, "backend", chosen, tuple(BACKENDS))]
        policy = config.check_choice(
            owner, "on_missing_gpu", self.on_missing_gpu or config.get("on_missing_gpu"), missing_gpu.NAMES
        )
        if self._backend_options is not None and self._backend_options[0] == info.name:
            options = self._backend_options[1]
        else:
            options = info.parse_options(self.backend_options)
        info.check(resources, self.num_nodes, options, image)
        ti = context["ti"]
        labels = {
            "dag_id": ti.dag_id,
            "task_id": ti.task_id,
            "run_id": ti.run_id,
            "try_number": str(ti.try_number),
            "map_index": str(getattr(ti, "map_index", -1)),
        }
        request = TaskRequest(
            resources,
            image,
            {**self.build_envelope(context, resources), "profile": report.envelope_section()},
            policy,  # type: ignore[arg-type]  # checked against missing_gpu.NAMES above
            labels,
            num_nodes=self.num_nodes,
            rendezvous_port=self.rendezvous_port,
        )
        return info, options, request

    def execute(self, context: Context) -> Any:
        """Plan the task on its backend and run it; the callable's return value goes to XCom."""
        info, options, request = self.resolved_request(context)
        backend = info.backend_class()(options, log=self.log)
        self.log.info(
            "GPU task %s on backend %r: %s; requirements %s; on_missing_gpu=%s",
            request.display_name,
            info.name,
            request.resources.describe(),
            request.image.requirements_hash,
            request.on_missing_gpu,
        )
        self._running_backend = backend
        profile = None
        try:
            result = backend.run(backend.plan(request), context)
            profile = result.profile
            return result.return_value
        except RemoteTaskError as err:
            profile = err.profile
            raise
        finally:
            self._running_backend = None
            self.gpu_profile = report.publish(profile, request, info.name, context, self.log)

    def render_manifests(
        self, context: Context | None = None, *, params: Mapping[str, Any] | None = None, backend: str = "kubernetes"
    ) -> list[dict[str, Any]]:
        """What this task would submit to a backend that renders (Kubernetes), as plain dicts; no cluster needed.

        :param context: a task context; without one, templates use the DAG's default params updated by ``params``
        :param backend: the backend to render for, whatever the task's own backend is
        """
        task, rendering = self, context
        if rendering is None:
            from airflow_gpu_provider.render import stand_in

            task, rendering = stand_in(self, params)
        info, options, request = task.resolved_request(rendering, backend=backend)
        if not info.renders:
            able = [name for name, other in BACKENDS.items() if other.renders]
            raise InvalidSettingError(
                f"{type(self).__name__}({self.task_id!r})", "backend", backend, "it cannot render", repr(able)
            )
        return info.backend_class()(options, log=self.log).render(request, rendering)

    def on_kill(self) -> None:
        """Stop the child process, container or pod of this try."""
        if self._running_backend is not None:
            self._running_backend.kill()
