"""The Kubernetes backend's plan: the pod of one task try, as KubernetesPodOperator arguments (API dicts).

Pure: no cluster and no client; it reads only ``pod_template_file`` when one is given.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_gpu_provider.backends.kubernetes import container
from airflow_gpu_provider.backends.kubernetes.kueue import kueue_labels
from airflow_gpu_provider.backends.kubernetes.options import KubernetesOptions, check_pod_template
from airflow_gpu_provider.backends.kubernetes.requirements import requirements_plan
from airflow_gpu_provider.backends.options import BadOption
from airflow_gpu_provider.backends.pods import dra, resources, scheduling
from airflow_gpu_provider.backends.pods.security import pod_security_context, security_context
from airflow_gpu_provider.checkpoint.location import CHECKPOINT_MOUNT, checkpoint_environment, unreachable
from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.pods import level_refused
from airflow_gpu_provider.settings import ResourceSettings
from airflow_gpu_provider.settings.image import DEFAULT_PARENT_IMAGE
from airflow_gpu_provider.task.labels import MANAGED_BY, kubernetes_label
from airflow_gpu_provider.task.request import TaskRequest

if TYPE_CHECKING:
    from airflow_gpu_provider.config.worker import GpuConfig

DEFAULT_RENDEZVOUS_PORT = 29500


class Cluster(NamedTuple):
    """The cluster's facts: its Kubernetes connection's extras, read on the worker (:func:`.backend.read_cluster`).

    :param kueue_queue: the LocalQueue of pods whose task names none (``''``: no Kueue); the admin's choice, so the
        final pod may name it without ``[gpu_policy] allowed_objects`` listing it
    :param parent_image: the image of tasks whose ``ImageSettings.parent_image`` is unset
    """

    gpu_allocation: str = "device-plugin"
    kueue_queue: str = ""
    parent_image: str = DEFAULT_PARENT_IMAGE


@dataclass(frozen=True)
class KubernetesPlan:
    """The pod a task try runs in, as KubernetesPodOperator arguments (Kubernetes API dicts, no client objects).

    :param resources: requests/limits of the main container (also named in pending-pod errors)
    :param pending_timeout: seconds a pod may stay unscheduled before the task fails
    :param cpu_fallback: the CPU-only plan to run when no GPU node takes the pod (``on_missing_gpu="cpu"``)
    :param num_nodes: pods of a multi-node launch (an Indexed Job), meeting on ``port``
    :param notes: what the plan could not give the task, for its log
    :param durable: a later try takes over the pod an earlier try left running (``TaskRequest.durable``)
    :param kueue_queue: the Kueue LocalQueue of the pod (or the Job), empty for none (:mod:`.kueue`)
    :param claim: with ``gpu_allocation="dra"``, the spec of the pod's GPU claim (:mod:`..pods.dra`): the operator
        creates its ResourceClaimTemplate with the pod, and the container has no extended-resource GPU limit
    :param envelope: the task's envelope (base64 JSON), which goes into the task's Secret, not the pod spec
        (:mod:`.companions`)
    :param allowed: the cluster objects the pod may name (``Policy.kubernetes``; rule P3)
    """

    task_id: str
    image: str
    command: list[str]
    args: list[str]
    environment: dict[str, str]
    resources: dict[str, dict[str, str]]
    options: KubernetesOptions
    volumes: list[dict[str, Any]] = field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)
    init_containers: list[dict[str, Any]] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    security_context: dict[str, Any] = field(default_factory=dict)
    pod_security_context: dict[str, Any] = field(default_factory=dict)
    pod_template: dict[str, Any] | None = None
    pending_timeout: float = 300.0
    cpu_fallback: KubernetesPlan | None = None
    num_nodes: int = 1
    port: int = DEFAULT_RENDEZVOUS_PORT
    termination_grace_period: int = 30
    notes: tuple[str, ...] = ()
    durable: bool = True
    kueue_queue: str = ""
    claim: dict[str, Any] | None = None
    envelope: str = ""
    allowed: dict[str, frozenset[str]] = field(default_factory=dict)


def load_pod_template(options: KubernetesOptions) -> dict[str, Any] | None:
    """The user's pod template as a dict (``pod_template_dict``, or the YAML/JSON in ``pod_template_file``).

    A template without containers gets an empty ``base`` one, for KubernetesPodOperator to merge the task's into.
    """
    if options.pod_template_dict is not None:
        template = copy.deepcopy(dict(options.pod_template_dict))
    elif options.pod_template_file is None:
        return None
    else:
        import yaml

        path = Path(options.pod_template_file)
        if not path.is_file():
            raise options.invalid("pod_template_file", str(path), "no such file", "a path to a Pod YAML file")
        try:
            template = check_pod_template(yaml.safe_load(path.read_text()))
        except BadOption as err:
            raise options.invalid("pod_template_file", str(path), err.reason, err.accepted) from None
    spec = template["spec"] = dict(template.get("spec") or {})
    if spec.get("containers") is None:
        spec["containers"] = [{"name": "base"}]
    return template


def plan_pod(
    request: TaskRequest, options: KubernetesOptions, conf: GpuConfig, cluster: Cluster | None = None
) -> KubernetesPlan:
    """Map the request onto the pod's pieces, with a CPU-only fallback pod under ``on_missing_gpu="cpu"``.

    The task's pod-security level must be one this worker's ``[gpu_policy] min_pod_security`` allows (rule P2); the pod
    itself is checked against it when KubernetesPodOperator has built it (``pod_operator.py``, rule P1).
    """
    policy, cluster = Policy.of(conf), cluster or Cluster()
    problem = level_refused(options.pod_security, policy.min_pod_security)
    if problem:
        raise GpuTaskError(
            f"{request.display_name}: backend_options['pod_security']={options.pod_security!r} is refused on this "
            f"worker: {problem}. Nothing was submitted."
        )
    allowed = dict(policy.objects)
    if cluster.kueue_queue:  # the connection's queue is the admin's (rule P3)
        allowed["kueue_queue"] = allowed.get("kueue_queue", frozenset()) | {cluster.kueue_queue}
    primary = _pod(request, options, conf, request.resources, allowed, cluster=cluster)
    if request.num_nodes > 1:
        return primary  # every node must get its GPUs: no CPU fallback for a multi-node launch
    if request.missing_gpu.runs_on_cpu and request.resources.requests_gpus:
        cpu_only = request.resources.without_gpus()
        fallback = _pod(request, options, conf, cpu_only, allowed, cluster=cluster, cpu_fallback=True)
        primary = dataclasses.replace(primary, cpu_fallback=fallback)
    return primary


def _pod(
    request: TaskRequest,
    options: KubernetesOptions,
    conf: GpuConfig,
    wanted: ResourceSettings,
    allowed: dict[str, frozenset[str]],
    *,
    cluster: Cluster,
    cpu_fallback: bool = False,
) -> KubernetesPlan:
    amounts = resources.container_resources(wanted)
    restricted = options.pod_security == "restricted"
    security = security_context(options.container_security_context, restricted=restricted, user=options.run_as_user)
    base_image = request.image.parent_image or cluster.parent_image
    deps = requirements_plan(
        request.image,
        mode=options.requirements_mode,
        base_image=base_image,
        derived_image=options.derived_image,
        installer_image=options.installer_image,
        security_context=security,
        resources=resources.without_accelerators(amounts),
        index_secret=options.index_secret,
    )
    template = load_pod_template(options)
    accelerator_key = resources.accelerator_resource(wanted)
    toleration_key = wanted.gpu_vendor.k8s_resource if accelerator_key else None  # MIG nodes too
    claim = gpu_claim(request, options, conf, wanted, (template or {}).get("spec") or {})
    if claim is not None:  # the claim selects the devices: no extended resource, no node labels for the model
        amounts = resources.without_accelerators(amounts)
        options = dataclasses.replace(options, label_scheme="none")
    place = scheduling.placement(wanted, toleration_key, options, (template or {}).get("spec"))
    # gpus None: the runtime asks nvidia-smi inside the pod
    pending = options.pending_timeout or request.missing_gpu.pending_timeout
    reason = f"no node took the GPU pod within pending_timeout ({pending:g} s)" if cpu_fallback else ""
    envelope = request.runtime_envelope(
        backend="kubernetes",
        image=deps.image,
        gpus=None,
        cpu_fallback=cpu_fallback,
        fallback_reason=reason,
        modules_from=container.MODULES_ENV,
    )
    shm_volumes, shm_mounts = resources.shm_volume(wanted)
    command, args = container.launch_command(result_to_log=request.num_nodes > 1)
    checkpoint_volumes, checkpoint_mounts, checkpoint_env, notes = checkpoint_volume(request, options)
    queue = options.kueue_queue_or(cluster.kueue_queue)
    return KubernetesPlan(
        task_id=request.labels.get("task_id", "gpu-task"),
        image=deps.image,
        command=command,
        args=args,
        environment=container.task_environment(
            wanted,
            {**request.image.environment, **deps.environment, **checkpoint_env},
            request.processes_per_node,
            None if request.envelope.modules is None else request.envelope.modules["zip"],
        ),
        resources=amounts,
        options=options,
        volumes=[*deps.volumes, *shm_volumes, *checkpoint_volumes],
        volume_mounts=[*deps.volume_mounts, *shm_mounts, *checkpoint_mounts],
        init_containers=deps.init_containers,
        node_selector=place.node_selector,
        tolerations=place.tolerations,
        affinity=scheduling.avoiding_nodes(place.affinity, request.avoid_nodes),
        labels={
            **MANAGED_BY,
            kubernetes_label("requirements"): request.image.requirements_hash,
            **(options.labels or {}),
            **kueue_labels(queue, options.kueue_priority_class),
        },
        annotations={kubernetes_label("resources"): envelope["summary"]["resources"], **(options.annotations or {})},
        security_context=security,
        pod_security_context=pod_security_context(restricted=restricted, user=options.run_as_user),
        pod_template=template,
        pending_timeout=pending,
        num_nodes=request.num_nodes,
        port=request.rendezvous_port or DEFAULT_RENDEZVOUS_PORT,
        termination_grace_period=round(conf.grace(options.termination_grace_period)),
        notes=notes,
        durable=request.durable,
        kueue_queue=queue,
        claim=claim,
        envelope=container.encode_envelope(envelope),
        allowed=allowed,
    )


def gpu_claim(
    request: TaskRequest, options: KubernetesOptions, conf: GpuConfig, wanted: ResourceSettings, template: Any
) -> dict[str, Any] | None:
    """The spec of the pod's DRA claim when the task allocates GPUs by DRA (the option, else the connection's)."""
    allocation = options.gpu_allocation or "device-plugin"
    if allocation not in dra.ALLOCATIONS:
        raise GpuTaskError(
            f"{request.display_name}: gpu_allocation={allocation!r} (the {options.kubernetes_conn_id} connection's "
            "extra) is not one of "
            f"{', '.join(map(repr, dra.ALLOCATIONS))}. Nothing was submitted."
        )
    if allocation != "dra" or not wanted.requests_gpus:
        return None
    options.check_dra(wanted, template)  # [gpu]'s default is seen only now; a template file too
    return dra.claim_spec(request.display_name, wanted, request.min_gpu_memory)


def checkpoint_volume(
    request: TaskRequest, options: KubernetesOptions
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, str], tuple[str, ...]]:
    """``(volumes, mounts, environment, notes)`` that show the pod its checkpoint folder.

    A URI root: the URI itself. A path root: the ``checkpoint_claim`` PersistentVolumeClaim (whose root is the
    checkpoint root), its subPath for this task mounted at :data:`CHECKPOINT_MOUNT`. A path root without a claim
    is not reachable from a pod (:func:`~airflow_gpu_provider.checkpoint.location.unreachable`: an error with
    ``resume=True``, else a note for the log).
    """
    location = request.checkpoint
    if location is not None and location.is_uri:
        return [], [], checkpoint_environment(location.path), ()
    if location is None:
        return [], [], {}, ()
    if options.checkpoint_claim is None:
        note = unreachable(
            request.display_name,
            location,
            resume=request.resume,
            where="in a pod",
            fix="Set backend_options['checkpoint_claim'] (a PersistentVolumeClaim whose root is the checkpoint root), "
            "or make checkpoint= (or [gpu] checkpoint_root) an object-storage URI",
        )
        return [], [], {}, (note,)
    volume = {"name": "checkpoint", "persistentVolumeClaim": {"claimName": options.checkpoint_claim}}
    mount = {"name": "checkpoint", "mountPath": CHECKPOINT_MOUNT, "subPath": location.relative}
    return [volume], [mount], checkpoint_environment(CHECKPOINT_MOUNT), ()
