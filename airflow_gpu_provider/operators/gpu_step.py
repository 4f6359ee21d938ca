"""``GpuStepOperator``: run a Python function or a command with the resources it declares, on any backend."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import AirflowFailException  # airflow.sdk.exceptions from 3.2
from airflow.sdk import BaseOperator

from airflow_gpu_provider.checkpoint.mixin import CheckpointMixin
from airflow_gpu_provider.dag_line import airflow_checks, entry_point
from airflow_gpu_provider.operators.arguments import check_names, check_payload
from airflow_gpu_provider.operators.execution import GpuExecution
from airflow_gpu_provider.operators.spec import TaskSpec, beside_spec, owner_name, task_owner
from airflow_gpu_provider.policy.secrets import MasksCredentials
from airflow_gpu_provider.settings.image import check_environment
from airflow_gpu_provider.task.call import call_arguments
from airflow_gpu_provider.task.modules import project_folders
from airflow_gpu_provider.telemetry.lineage import LineageMixin

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.definitions.mappedoperator import OperatorPartial

    from airflow_gpu_provider.config.worker import GpuConfig
    from airflow_gpu_provider.escalation.tries import Tries
    from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
    from airflow_gpu_provider.settings.escalation import OomEscalation
    from airflow_gpu_provider.task.callable import ShippedCallable
    from airflow_gpu_provider.task.envelope import Envelope
    from airflow_gpu_provider.task.request import TaskRequest


class GpuStepOperator(GpuExecution, MasksCredentials, CheckpointMixin, LineageMixin, BaseOperator):
    """Run a Python callable or a command on GPUs, on any backend of the registry (``backends.BACKENDS``).

    Declare resources once (``resources=ResourceSettings(...)`` or the shortcuts) and the backend maps them:
    the local backend to devices from the host's GPU allocator, Docker to device requests, Kubernetes to
    resource limits and node selectors. The callable's source is shipped to the task process; arguments and the
    return value (pushed to XCom) travel as JSON. Every argument is declared here, so ``.partial()`` and
    ``.expand()`` take each one, and all are settled once when the DAG is parsed (:meth:`settle`).

    :param python_callable: function to run; it must import what it uses inside its body
    :param command: argument list (or a string split with ``shlex``; no shell) to run instead (templated)
    :param op_args: positional arguments for the callable (templated)
    :param op_kwargs: keyword arguments for the callable (templated)
    :param resources: the task's :class:`ResourceSettings`
    :param image: the task's :class:`ImageSettings`
    :param backend: a backend of :data:`airflow_gpu_provider.backends.BACKENDS` (``"local"``, ``"docker"``,
        ``"kubernetes"``, ``"ray"``, ``"executor"``, ...); default ``[gpu] backend`` (templated)
    :param on_missing_gpu: ``"fail"``, ``"wait"`` or ``"cpu"``; default ``[gpu] on_missing_gpu`` (templated)
    :param backend_options: backend-specific options (connection ids, namespace, ...), checked at parse time
    :param environment: extra environment variables for the task process (templated)
    :param on_oom: an :class:`OomEscalation` ladder: after an out-of-memory failure the next try asks for its next
        step (a larger GPU, MIG slice or memory limit); other failures retry unchanged
    :param cpu_count: shortcut for ``resources.cpu_count`` (a template is validated when rendered)
    :param gpu_count: shortcut for ``resources.gpu_count`` (likewise)
    :param gpu_share: shortcut for ``resources.gpu_share``, a share of one GPU by memory: ``"8GiB"`` (likewise)
    :param memory: shortcut for ``resources.memory`` (likewise)
    :param accelerator: shortcut for ``resources.accelerator`` (likewise)
    :param gpu_vendor: shortcut for ``resources.gpu_vendor`` (likewise)
    :param mig_profile: shortcut for ``resources.mig_profile`` (likewise)
    :param shm_size: shortcut for ``resources.shm_size`` (likewise)
    :param parent_image: shortcut for ``image.parent_image``
    :param requirements: shortcut for ``image.requirements``
    :param python_package_installer: shortcut for ``image.python_package_installer``
    :param modules: modules and packages next to the DAG file to ship with the task (``["plmod", "mypkg"]``):
        checked at parse (present, no link, at most 256 KiB), read when the task starts, first on the task's path
        on every backend. The local and executor backends also put the DAG's folder and bundle on the path.
    :param checkpoint: an absolute path or object-storage URI (``s3://bucket/ckpt``, an ``ObjectStoragePath``) under
        which the task's checkpoint folder is made; ``False`` for none; default ``[gpu] checkpoint_root`` (templated)
    :param resume: each try looks for the newest checkpoint in its checkpoint folder (``AIRFLOW_GPU_CHECKPOINT_DIR``):
        an ``accelerator.save_state`` folder or a Hugging Face Trainer's ``checkpoint-N``. Its path is in
        ``AIRFLOW_GPU_RESUME_FROM`` (unset on a fresh start), its number in ``AIRFLOW_GPU_RESUME_STEP``; a function's
        ``save_state`` checkpoint is loaded right after its first ``accelerator.prepare(...)``; default ``False``
    :param deferrable: run the container or pod while the task is deferred (no worker slot held), and defer a wait
        for GPUs; default Airflow's ``[operators] default_deferrable`` (docs/deferrable.md)
    :param durable: a later try of the same task instance takes over the container or pod an earlier try left
        running (a worker restart reattaches instead of restarting); default ``True``
    :param reattach: deprecated: ``durable``'s name before (read for one more release, with a warning)
    :param wait_timeout: seconds (or a ``timedelta``) an ``on_missing_gpu="wait"`` task waits for GPUs; default
        ``[gpu] wait_timeout``
    :param right_size: a run's first try asks for the smallest GPU (or MIG slice) of the host that held the last
        successful run's peak memory with headroom (local, Docker; docs/telemetry.md); default ``False``
    :param task_spec: the task as the decorator (or ``.partial()``) already settled it; arguments given beside it
        settle it again
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
    rendezvous_port: int | None = None  # where a multi-node launch meets (AccelerateOperator's main_process_port)
    ui_color = "#76b900"
    ui_fgcolor = "#ffffff"

    @entry_point(task_owner)
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
        gpu_count: float | str | None = None,
        gpu_share: int | str | None = None,
        memory: int | str | None = None,
        accelerator: str | Sequence[str] | None = None,
        gpu_vendor: Any = None,
        mig_profile: str | None = None,
        shm_size: int | str | None = None,
        parent_image: str | None = None,
        requirements: Sequence[str] | None = None,
        python_package_installer: str | None = None,
        modules: Sequence[str] | None = None,
        checkpoint: Any = None,
        resume: bool | None = None,
        deferrable: bool | None = None,
        durable: bool | None = None,
        reattach: bool | None = None,
        wait_timeout: Any = None,
        right_size: bool | None = None,
        task_spec: TaskSpec | None = None,
        **kwargs: Any,
    ) -> None:
        given = {name: value for name, value in locals().items() if name not in ("self", "kwargs", "task_spec")}
        owner = task_owner(self, task_spec=task_spec, **kwargs)
        check_names(owner, type(self), kwargs)
        self.task_spec = spec = type(self).settle(owner, {**given, "dag": kwargs.get("dag")}, task_spec)
        self.shipped = spec.shipped
        self.python_callable, self.command = python_callable, command
        self.op_args, self.op_kwargs = list(op_args or []), dict(op_kwargs or {})
        # templated arguments as given, rendered at start (settled in task_spec); None (not given) is not serialised
        self.backend, self.on_missing_gpu = backend, on_missing_gpu
        self.checkpoint = spec.checkpoint  # as checked (a path-like as text); a template is rendered when it starts
        self.resource_overrides = dict(spec.templated) or None
        self.environment = dict(environment or {}) or None  # checked by settle
        with airflow_checks(spec.owner, "BaseOperator(...)"):
            super().__init__(**spec.placed(kwargs))
        self.durable = spec.durable  # Airflow's ResumableJobMixin attribute (its own __init__ leaves its default)
        if spec.starts_in_triggerer:  # it starts by waiting for its GPUs in the triggerer
            from airflow_gpu_provider.host.trigger import start_args

            self.start_trigger_args = start_args(spec.resources, spec.wait_timeout)
            self.start_from_trigger = True

    @classmethod
    def settle(
        cls, owner: str, arguments: Mapping[str, Any], settled: TaskSpec | None = None, *, complete: bool = True
    ) -> TaskSpec:
        """The front door: a task of this operator settled from its arguments, the one place that checks them.

        Called once per task, when the DAG is parsed: by ``__init__``, :meth:`partial` and ``@task.gpu``
        (``settled``: as the decorator or ``.partial()`` settled it; arguments given again settle it anew).

        :param complete: the call is whole; ``False`` where ``.expand()`` or the function's call may add the rest
        """
        spec = cls._settled(owner, arguments, settled)
        check_environment(spec.owner, "environment", arguments.get("environment") or {})
        return spec._replace(shipped=cls._payload(spec.owner, arguments, complete=complete))

    @classmethod
    def _settled(cls, owner: str, arguments: Mapping[str, Any], settled: TaskSpec | None) -> TaskSpec:
        """The task's settings settled (a subclass adds its own: AccelerateOperator's launch options)."""
        return TaskSpec.settle(owner, arguments) if settled is None else settled.changed(arguments)

    @classmethod
    def _payload(cls, owner: str, arguments: Mapping[str, Any], *, complete: bool) -> ShippedCallable | None:
        """The function's shipped form (``None``: a command), its call checked (:func:`.arguments.check_payload`)."""
        return check_payload(owner, arguments, complete=complete)

    @classmethod
    @entry_point(task_owner)
    def partial(cls, *, task_id: str, **kwargs: Any) -> OperatorPartial:  # type: ignore[override]
        """``.partial(...)`` for ``.expand(...)``: the task is settled and placed now, as a plain task is.

        The scheduler reads the GPU pool (and the executor's placement) of a mapped task from these arguments,
        before any copy of the operator exists.
        """
        owner = owner_name(cls.__name__, task_id)
        check_names(owner, cls, kwargs)
        spec = cls.settle(owner, kwargs, complete=False)
        placed = spec.placed(beside_spec(kwargs))
        partial = vars(BaseOperator)["partial"].class_method.__func__  # BaseOperator's, for this class
        with airflow_checks(owner, "partial()"):
            return partial(cls, task_id=task_id, **placed, task_spec=spec)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ execution
    def build_envelope(self, context: Context, spec: TaskSpec) -> Envelope:
        """The envelope of this try, for the rendered task; subclasses wrap the payload."""
        from airflow_gpu_provider.task.envelope import Envelope

        modules = None if spec.modules is None else spec.modules.shipped(spec.owner)
        if self.shipped is None:
            command = self.command or []
            argv = shlex.split(command) if isinstance(command, str) else list(command)
            return Envelope.run(argv).with_modules(modules)
        assert self.python_callable is not None
        args, kwargs = call_arguments(
            self.shipped, self.shipped.signature, self.op_args, self.op_kwargs, context, owner=self.task_spec.owner
        )
        return Envelope.call(self.shipped, args, kwargs).with_modules(modules)

    def rendered_spec(self, *, backend: str | None = None) -> TaskSpec:
        """The settled task after its templates were rendered (``backend``: another backend, to render for it)."""
        spec = self.task_spec.rendered(
            backend=self.backend,
            on_missing_gpu=self.on_missing_gpu,
            overrides=self.resource_overrides,
            environment=self.environment,
        )
        return spec if backend is None else spec.on(backend)

    def task_request(
        self, context: Context, spec: TaskSpec, conf: GpuConfig, tries: Tries | None = None
    ) -> TaskRequest:
        """The try's backend-independent request; its placement is settled here only: rung, right-size, avoided nodes.

        :param tries: the tries so far, with an ``on_oom`` ladder: the request is this try's rung
        """
        from airflow_gpu_provider.escalation import infrastructure
        from airflow_gpu_provider.task.labels import task_labels  # run time: off the parse path
        from airflow_gpu_provider.task.request import TaskRequest
        from airflow_gpu_provider.telemetry import report

        resources, rung = spec.resources, None
        if tries is not None:
            rung = tries.rung(resources)
            self.log.info("%s", rung.line)
            if rung.exhausted:
                raise AirflowFailException(
                    f"{rung.line}: the on_oom ladder has no larger {rung.exhausted} step. Add one to the ladder, or "
                    "make the task use less memory (a smaller batch)."
                )
            resources = rung.resources
            spec.info.check(resources, spec.num_nodes, spec.options, spec.image)  # type: ignore[arg-type]
        labels = task_labels(context["ti"])
        assert spec.on_missing_gpu is not None  # rendered
        request = TaskRequest(
            resources,
            spec.image,
            self.build_envelope(context, spec).sampled(report.envelope_section(conf)),
            spec.on_missing_gpu,
            labels,
            num_nodes=spec.num_nodes,
            rendezvous_port=self.rendezvous_port,
            min_gpu_memory=rung.min_gpu_memory if rung is not None else None,
            checkpoint=self.checkpoint_location(labels, conf),
            resume=spec.resume,
            project_path=self.project_path(context),
            avoid_nodes=infrastructure.avoided_nodes(context) if spec.info.avoids_nodes else (),
        )
        if not spec.right_size:
            return request
        from airflow_gpu_provider.telemetry import right_size  # the smallest GPU that held the last run's peak

        return right_size.applied(request, spec.right_size, tries, context, self.log)

    def project_path(self, context: Context) -> tuple[str, ...]:
        """The worker's folders of this task's project code: its DAG file's folder, its DAG bundle's root."""
        bundle = getattr(getattr(context.get("ti"), "bundle_instance", None), "path", None)
        dag_file = self.shipped.filename if self.shipped is not None else self.dag.fileloc if self.has_dag() else None
        return project_folders(dag_file, None if bundle is None else str(bundle))

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
        from airflow_gpu_provider.render import render_task

        return render_task(self, context, params=params, backend=backend, after=after)
