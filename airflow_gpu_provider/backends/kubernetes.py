"""Kubernetes backend: one pod per task try, run by the cncf-kubernetes provider's KubernetesPodOperator.

``plan()`` is pure: it maps the request onto the pod's pieces (API dicts) in a :class:`KubernetesPlan`. ``run()``
hands them to KubernetesPodOperator (its hook, connection, namespace and in-cluster handling, log streaming and XCom
sidecar) and turns the outcome into a return value or a typed error. Options: ``docs/kubernetes.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_gpu_provider import config
from airflow_gpu_provider.backends.base import Backend, TaskRequest, TaskResult, result_value
from airflow_gpu_provider.exceptions import GpuUnavailableError, InvalidSettingError, MissingDependencyError
from airflow_gpu_provider.kubernetes import container, resources, scheduling
from airflow_gpu_provider.kubernetes.options import OWNER, KubernetesOptions
from airflow_gpu_provider.kubernetes.requirements import requirements_plan
from airflow_gpu_provider.runtime.bootstrap import RESULT_TO_LOG
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings

MANAGED_BY = {"app.kubernetes.io/managed-by": "airflow-gpu-provider"}
DEFAULT_PENDING_TIMEOUT = {"fail": 300.0, "cpu": 300.0, "wait": 86400.0}
DEFAULT_RENDEZVOUS_PORT = 29500
# A multi-node run has no XCom sidecar: rank 0 prints its result as the last log line instead.
MULTINODE_RESULT_PATH = "/tmp/airflow-gpu-result.json"


@dataclass(frozen=True)
class KubernetesPlan:
    """The pod a task try runs in, as KubernetesPodOperator arguments (Kubernetes API dicts, no client objects).

    :param accelerator_limits: requests/limits of the main container (also named in pending-pod errors)
    :param pending_timeout: seconds a pod may stay unscheduled before the task fails
    :param cpu_fallback: the CPU-only plan to run when no GPU node takes the pod (``on_missing_gpu="cpu"``)
    """

    task_id: str
    image: str
    command: list[str]
    args: list[str]
    environment: dict[str, str]
    resources: dict[str, dict[str, str]]
    options: KubernetesOptions
    display_name: str
    volumes: list[dict[str, Any]] = field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)
    init_containers: list[dict[str, Any]] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    security_context: dict[str, Any] = field(default_factory=dict)
    pod_template: dict[str, Any] | None = None
    pending_timeout: float = 300.0
    cpu_fallback: KubernetesPlan | None = None
    num_nodes: int = 1
    port: int = DEFAULT_RENDEZVOUS_PORT


def load_pod_template(options: KubernetesOptions) -> dict[str, Any] | None:
    """The user's pod template as a dict (``pod_template_dict``, or the YAML/JSON in ``pod_template_file``)."""
    if options.pod_template_dict is not None:
        return dict(options.pod_template_dict)
    if options.pod_template_file is None:
        return None
    import yaml

    path = Path(options.pod_template_file)
    if not path.is_file():
        raise InvalidSettingError(
            OWNER, "backend_options['pod_template_file']", str(path), "no such file", "a path to a Pod YAML file"
        )
    template = yaml.safe_load(path.read_text())
    if not isinstance(template, dict) or template.get("kind", "Pod") != "Pod":
        raise InvalidSettingError(
            OWNER, "backend_options['pod_template_file']", str(path), "not a Pod manifest", "kind: Pod"
        )
    return template


def _operator_module() -> Any:
    """:mod:`airflow_gpu_provider.kubernetes.operator`, which needs the ``kubernetes`` extra."""
    try:
        from airflow_gpu_provider.kubernetes import operator
    except ImportError as err:
        raise MissingDependencyError(f"The 'kubernetes' backend ({err.name})", "kubernetes") from err
    return operator


class KubernetesBackend(Backend[KubernetesPlan]):
    """Run each task try in a pod that asks for the task's GPUs, CPUs and memory."""

    name = "kubernetes"
    option_names = KubernetesOptions.names()

    def __init__(self, options: Mapping[str, Any] | None = None, log: Any = None) -> None:
        super().__init__(options, log)
        self.settings = KubernetesOptions.parse(self.options)
        self._operator: Any = None

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        """Names and values, at DAG parse time."""
        KubernetesOptions.parse(options)

    @classmethod
    def check_request(cls, options: Mapping[str, Any], resources_: ResourceSettings, image: ImageSettings) -> None:
        """Check at DAG parse time that a pod can express these resources under these options."""
        settings = KubernetesOptions.parse(options)
        resources.check_expressible(resources_)
        scheduling.accelerator_requirements(resources_, settings.label_scheme, settings.accelerator_labels)

    # ------------------------------------------------------------------ plan (pure)
    def plan(self, request: TaskRequest) -> KubernetesPlan:
        """Map the request onto the pod's pieces. No cluster access; reads ``pod_template_file`` if given."""
        primary = self._plan_pod(request, request.resources)
        if request.num_nodes > 1:
            return primary  # every node must get its GPUs: no CPU fallback for a multi-node launch
        if request.on_missing_gpu == "cpu" and request.resources.requests_gpus:
            cpu_only = request.resources.with_overrides(gpu_count=0, accelerator=None, mig_profile=None)
            fallback = self._plan_pod(request, cpu_only, note=" (CPU fallback)")
            primary = dataclasses.replace(primary, cpu_fallback=fallback)
        return primary

    def _plan_pod(self, request: TaskRequest, wanted: ResourceSettings, note: str = "") -> KubernetesPlan:
        options = self.settings
        amounts = resources.container_resources(wanted)
        security = container.security_context(options.container_security_context)
        base_image = request.image.parent_image or config.get("default_parent_image")
        deps = requirements_plan(
            request.image,
            mode=options.requirements_mode,
            base_image=base_image,
            derived_image=options.derived_image,
            installer_image=options.installer_image,
            security_context=security,
            resources=resources.without_accelerators(amounts),
        )
        template = load_pod_template(options)
        accelerator_key = resources.accelerator_resource(wanted)
        toleration_key = wanted.gpu_vendor.k8s_resource if accelerator_key else None  # MIG nodes too
        place = scheduling.placement(wanted, toleration_key, options, (template or {}).get("spec"))
        described = wanted.describe() + note
        envelope = dict(request.envelope)
        envelope["summary"] = {
            "backend": self.name,
            "image": deps.image,
            "requirements_hash": request.image.requirements_hash,
            "resources": described,
            "gpus": None,  # the runtime asks nvidia-smi inside the pod
        }
        shm_volumes, shm_mounts = resources.shm_volume(wanted)
        command, args = container.launch_command()
        environment = {**request.image.environment, **deps.environment}
        if request.num_nodes > 1:
            args = [args[0], MULTINODE_RESULT_PATH]
            environment[RESULT_TO_LOG] = "1"
        timeout = options.pending_timeout or DEFAULT_PENDING_TIMEOUT[request.on_missing_gpu]
        return KubernetesPlan(
            task_id=request.labels.get("task_id", "gpu-task"),
            image=deps.image,
            command=command,
            args=args,
            environment=container.task_environment(wanted, environment, envelope),
            resources=amounts,
            options=options,
            display_name=request.display_name,
            volumes=[*deps.volumes, *shm_volumes],
            volume_mounts=[*deps.volume_mounts, *shm_mounts],
            init_containers=deps.init_containers,
            node_selector=place.node_selector,
            tolerations=place.tolerations,
            affinity=place.affinity,
            labels={
                **MANAGED_BY,
                "airflow-gpu-provider/requirements": request.image.requirements_hash,
                **options.labels,
            },
            annotations={"airflow-gpu-provider/resources": described, **options.annotations},
            security_context=security,
            pod_template=template,
            pending_timeout=timeout,
            num_nodes=request.num_nodes,
            port=int((request.envelope.get("launch") or {}).get("port") or DEFAULT_RENDEZVOUS_PORT),
        )

    # ------------------------------------------------------------------ run (I/O)
    def run(self, plan: KubernetesPlan) -> TaskResult:
        """Run the pod with KubernetesPodOperator inside the current task; the pod is deleted on every path."""
        from airflow.sdk import get_current_context

        context = get_current_context()
        if plan.num_nodes > 1:
            return self._run_job(plan, context)
        try:
            return self._run_pod(plan, context)
        except GpuUnavailableError as err:
            if plan.cpu_fallback is None:
                raise
            self.log.warning("%s Running the task on CPU instead (on_missing_gpu='cpu').", err)
            return self._run_pod(plan.cpu_fallback, context)

    def _run_pod(self, plan: KubernetesPlan, context: Any) -> TaskResult:
        operator = _operator_module().build_operator(plan)
        self._operator = operator
        try:
            envelope = operator.execute_sync(context)
        except Exception as err:  # KubernetesPodOperator has deleted the pod by now
            explained = operator.explain_failure(plan)
            if explained is None:
                raise
            raise explained from err
        finally:
            self._operator = None
        return TaskResult(result_value(envelope, 0, where=f"pod {operator.pod_label}"), 0)

    def _run_job(self, plan: KubernetesPlan, context: Any) -> TaskResult:
        """A multi-node launch: an Indexed Job plus its headless Service, removed on every path."""
        from airflow_gpu_provider.kubernetes.multinode_run import IndexedJobRun, multinode_manifests

        layout, service, job = multinode_manifests(plan, plan.num_nodes, port=plan.port, context=context)
        hook = _operator_module().build_operator(plan).hook
        run = IndexedJobRun(hook, layout, service, job, log=self.log, pending_timeout=plan.pending_timeout)
        self._operator = run
        try:
            result = run.run()
        finally:
            self._operator = None
        return TaskResult(result_value(result, 0, where=f"Job {layout.name} (rank 0)"), 0)

    def render(self, plan: KubernetesPlan, context: Any = None) -> list[dict[str, Any]]:
        """The objects :meth:`run` would submit, as API dicts (built by KubernetesPodOperator, no cluster)."""
        module = _operator_module()
        if plan.num_nodes > 1:
            from airflow_gpu_provider.kubernetes.multinode_run import multinode_manifests

            _, service, job = multinode_manifests(plan, plan.num_nodes, port=plan.port, context=context)
            return [service, job]
        return [module.to_dict(module.build_operator(plan).build_pod_request_obj(context, dry_run=True))]

    def kill(self) -> None:
        """Delete the running pod (KubernetesPodOperator's ``on_kill``)."""
        operator = self._operator
        if operator is not None:
            operator.on_kill()
