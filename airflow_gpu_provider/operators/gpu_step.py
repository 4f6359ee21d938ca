"""``GpuStepOperator``: run a Python function or a command with the resources it declares, on any backend."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_gpu_provider import config
from airflow_gpu_provider.backends import BACKENDS, BackendInfo
from airflow_gpu_provider.exceptions import GpuUnavailableError, InvalidSettingError, RemoteTaskError
from airflow_gpu_provider.operators.arguments import argv, check_on_oom, is_template, resolve_resources
from airflow_gpu_provider.operators.checkpoint import CheckpointMixin
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
from airflow_gpu_provider.settings.escalation import OomEscalation
from airflow_gpu_provider.settings.image import check_environment
from airflow_gpu_provider.task import missing_gpu
from airflow_gpu_provider.telemetry.lineage import LineageMixin

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_gpu_provider.backends.base import Backend
    from airflow_gpu_provider.backends.options import BackendOptions
    from airflow_gpu_provider.task import escalation
    from airflow_gpu_provider.task.request import TaskRequest


class GpuStepOperator(CheckpointMixin, LineageMixin, BaseOperator):
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
    :param on_oom: an :class:`OomEscalation` ladder: after an out-of-memory failure the next try asks for its next
        step (a larger GPU, MIG slice or memory limit); other failures retry unchanged
    :param cpu_count: shortcut for ``resources.cpu_count`` (a template is validated when rendered); likewise
        ``gpu_count``, ``memory``, ``accelerator``, ``gpu_vendor``, ``mig_profile``, ``shm_size``
    :param requirements: shortcut for ``image.requirements``; likewise ``parent_image``,
        ``python_package_installer``
    :param checkpoint: the root of the task's checkpoint folder, or ``False`` (:class:`CheckpointMixin`) (templated)
    """

    template_fields: Sequence[str] = (
        "op_args",
        "op_kwargs",
        "command",
        "backend",
        "on_missing_gpu",
        "environment",
        "resource_overrides",
        "checkpoint",
    )
    template_fields_renderers = dict(op_args="py", op_kwargs="py", environment="json", resource_overrides="json")
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
        on_oom: OomEscalation | None = None,
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

        shortcuts = {"cpu_count": cpu_count, "gpu_count": gpu_count, "memory": memory, "accelerator": accelerator}
        shortcuts.update(gpu_vendor=gpu_vendor, mig_profile=mig_profile, shm_size=shm_size)
        self.resource_settings, self.resource_overrides = resolve_resources(resources, shortcuts, owner=owner)
        image = image or ImageSettings()
        image_shortcuts: dict[str, Any] = {"parent_image": parent_image, "requirements": requirements}
        image_shortcuts["python_package_installer"] = python_package_installer
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
        self.on_oom = check_on_oom(owner, on_oom, None if self.resource_overrides else self.resource_settings)
        self._running_backend: Backend[Any, Any] | None = None
        kwargs = place(owner, backend, backend_options, self.resource_settings, self.resource_overrides, kwargs)
        super().__init__(**kwargs)

    # ------------------------------------------------------------------ execution
    def build_envelope(self, context: Context, resources: ResourceSettings) -> dict[str, Any]:
        """The runtime envelope for this try, for these (rendered) resources; subclasses wrap the payload."""
        owner = f"{type(self).__name__}({self.task_id!r})"
        if self.shipped is None:
            return command_envelope(argv(self.command or []))
        assert self.python_callable is not None
        args, kwargs = call_arguments(
            self.shipped, inspect.signature(self.python_callable), self.op_args, self.op_kwargs, context, owner=owner
        )
        return callable_envelope(self.shipped, args, kwargs)

    def resolved_request(
        self, context: Context, *, backend: str | None = None, tries: escalation.Tries | None = None
    ) -> tuple[BackendInfo, BackendOptions, TaskRequest]:
        """The backend, its options and the backend-independent request, after templates are rendered.

        :param backend: a backend other than the task's own (``render_manifests``)
        :param tries: the tries so far, with an ``on_oom`` ladder: the request is this try's rung
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
        rung = None
        if tries is not None:
            check_on_oom(owner, tries.on_oom, resources)
            rung = tries.rung(resources)
            self.log.info("%s", rung.line)
            if rung.exhausted:
                raise AirflowFailException(
                    f"{rung.line}: the on_oom ladder has no larger {rung.exhausted} step. Add one, or make the "
                    "task use less memory (a smaller batch)."
                )
            resources = rung.resources
        info.check(resources, self.num_nodes, options, image)
        from airflow_gpu_provider.task.request import TaskRequest, task_labels  # run time: off the parse path
        from airflow_gpu_provider.telemetry import report

        labels = task_labels(context["ti"])
        request = TaskRequest(
            resources,
            image,
            {**self.build_envelope(context, resources), "profile": report.envelope_section()},
            policy,  # type: ignore[arg-type]  # checked against missing_gpu.NAMES above
            labels,
            num_nodes=self.num_nodes,
            rendezvous_port=self.rendezvous_port,
            min_gpu_memory=rung.min_gpu_memory if rung is not None else None,
            checkpoint=self.checkpoint_location(labels),
        )
        return info, options, request

    def execute(self, context: Context) -> Any:
        """Plan the task on its backend and run it; the callable's return value goes to XCom."""
        from airflow_gpu_provider.task import escalation
        from airflow_gpu_provider.task.request import task_labels
        from airflow_gpu_provider.telemetry import report

        tries = escalation.Tries.start(self.on_oom, task_labels(context["ti"])) if self.on_oom is not None else None
        info, options, request = self.resolved_request(context, tries=tries)
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
        profile: Mapping[str, Any] | None = None
        failure: BaseException | None = None
        try:
            result = backend.run(backend.plan(request), context)
            profile = result.profile
            return result.return_value
        except BaseException as err:
            failure, profile = err, err.profile if isinstance(err, RemoteTaskError) else None
            if isinstance(err, GpuUnavailableError) and request.min_gpu_memory is not None:
                raise AirflowFailException(str(err)) from err  # no GPU of this host is larger: retrying cannot help
            raise
        finally:
            self._running_backend = None
            self.gpu_profile = report.publish(profile, request, info.name, context, self.log)
            if tries is not None:
                context["ti"].xcom_push(escalation.XCOM_KEY, tries.finish(request.resources, failure))

    def render_manifests(
        self,
        context: Context | None = None,
        *,
        params: Mapping[str, Any] | None = None,
        backend: str = "kubernetes",
        after: Sequence[str] = (),
    ) -> list[dict[str, Any]]:
        """What this task would submit to a backend that renders (Kubernetes), as plain dicts; no cluster needed.

        :param context: a task context; without one, templates use the DAG's default params updated by ``params``
        :param backend: the backend to render for, whatever the task's own backend is
        :param after: how earlier tries ended (``"gpu_oom"``, ``"host_oom"``, ``"error"``): render the try that
            follows them on the ``on_oom`` ladder
        """
        task, rendering = self, context
        if rendering is None:
            from airflow_gpu_provider.render import stand_in

            task, rendering = stand_in(self, params)
        from airflow_gpu_provider.task import escalation

        tries = escalation.Tries.after(self.on_oom, {}, after) if self.on_oom is not None else None
        if after and tries is None:
            raise InvalidSettingError(f"{type(self).__name__}({self.task_id!r})", "after", list(after), "no on_oom")
        info, options, request = task.resolved_request(rendering, backend=backend, tries=tries)
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
