"""The Ray backend's plan: the job ``run()`` submits through Ray's Jobs API, decided without touching the cluster.

One task try is one Ray job. Its entrypoint runs the provider's runtime archive with the task's envelope; both
travel in the job's ``runtime_env`` ``working_dir`` (Ray uploads a folder once per content hash, so the modules a
task ships with ``modules=``, inside the envelope, are hashed with it), and so do the task's own variables
(``ImageSettings.environment``, often credentials). Every holder of the cluster's token reads a job's
``runtime_env``, entrypoint and metadata through the Jobs API, and Ray logs the ``runtime_env`` on every node: those
carry only the provider's own variables, file names and the task instance's identity. The resources become the
entrypoint's (``entrypoint_num_gpus`` & co., fractions of a GPU included), the accelerator a node label selector,
the requirements the ``runtime_env``'s ``uv`` or ``pip`` field. On several machines the entrypoint is the node driver
(``nodes.py``): a ``STRICT_SPREAD`` placement group of one bundle per node, and a rank on each. The runtime always
runs beneath ``reaper.py``, which stops whatever the task left running on its node.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.backends.ray.options import VENDOR_RESOURCES, RayOptions, ray_accelerator_type
from airflow_gpu_provider.backends.ray.reaper import ENVIRONMENT
from airflow_gpu_provider.checkpoint.location import checkpoint_environment
from airflow_gpu_provider.settings import ResourceSettings
from airflow_gpu_provider.task.environment import thread_environment, with_user_environment
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.runtime_zip import FILE_NAME

if TYPE_CHECKING:
    from airflow_gpu_provider.config.worker import GpuConfig

ENVELOPE = "envelope.json"
NODES = "nodes.json"  # the node driver's instructions (several machines)
DRIVER = "airflow_gpu_ray_nodes.py"  # nodes.py, as the working_dir holds it
REAPER = "airflow_gpu_ray_reaper.py"  # reaper.py: the subreaper of the runtime and all it starts
RESULT_TO_LOG = "-"  # the runtime prints its result as the last log line: nothing else travels back from a job
#: the metadata keys a job carries: the task instance it belongs to (a reattach checks them)
IDENTITY = ("dag_id", "task_id", "run_id", "map_index")


@dataclass(frozen=True)
class RayPlan:
    """One task try as a Ray job.

    :param submit: ``JobSubmissionClient.submit_job`` arguments but ``runtime_env``, ``submission_id`` and
        ``metadata`` (made when it is submitted)
    :param runtime_env: the job's runtime environment but its ``working_dir`` (the folder ``run()`` writes): no
        secret, no argument
    :param environment: the task's own variables, for the ``working_dir``'s ``environment.json`` (``reaper.py``)
    :param nodes: the node driver's instructions on several machines (``nodes.json``), else ``None``
    :param pending_timeout: seconds the job may wait for the cluster's resources before ``on_missing_gpu`` applies
    :param poll_interval: seconds between two looks at the job (``[gpu] poll_interval``)
    :param cpu_fallback: the same job without GPUs (``on_missing_gpu="cpu"``), or ``None``
    """

    request: TaskRequest
    options: RayOptions
    entrypoint: str
    submit: dict[str, Any]
    runtime_env: dict[str, Any]
    metadata: dict[str, str]
    environment: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, Any] | None = None
    pending_timeout: float = 300.0
    poll_interval: float = 1.0
    cpu_fallback: RayPlan | None = None
    on_cpu: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def try_number(self) -> str:
        """The try this plan runs, as its labels carry it (``durable.py`` records it with the job)."""
        return str(self.request.labels.get("try_number", ""))


def resource_request(resources: ResourceSettings) -> dict[str, Any]:
    """The entrypoint's (or each bundle's) resources, as Ray names them: CPU, GPU (or the vendor's), memory."""
    wanted: dict[str, Any] = {}
    if resources.cpu_count is not None:
        wanted["CPU"] = resources.cpu_count
    if resources.requests_gpus:
        name = VENDOR_RESOURCES.get(resources.gpu_vendor.name, "GPU")
        wanted[name] = resources.gpu_count
    if resources.memory is not None:
        wanted["memory"] = resources.memory
    return wanted


def label_selector(resources: ResourceSettings, options: RayOptions) -> dict[str, str]:
    """The node labels the job asks for: ``label_selector``, and the accelerator models (``in(...)`` for a list)."""
    selector = dict(options.label_selector or {})
    models = list(dict.fromkeys(ray_accelerator_type(model) for model in resources.accelerators))
    if models:
        selector[options.accelerator_label] = models[0] if len(models) == 1 else f"in({','.join(models)})"
    return selector


def _entrypoint_arguments(wanted: dict[str, Any]) -> dict[str, Any]:
    """``submit_job``'s resource arguments for one entrypoint."""
    custom = {k: float(v) for k, v in wanted.items() if k not in ("CPU", "GPU", "memory")}
    arguments = {
        "entrypoint_num_cpus": wanted.get("CPU"),
        "entrypoint_num_gpus": wanted.get("GPU"),
        "entrypoint_memory": wanted.get("memory"),
        "entrypoint_resources": custom or None,
    }
    return {k: v for k, v in arguments.items() if v is not None}


def _installer(request: TaskRequest) -> dict[str, Any]:
    """The ``runtime_env`` field that installs the task's requirements on the cluster (uv or pip), or nothing."""
    image = request.image
    if not image.requirements:
        return {}
    index = image.installer_index_args()  # no credentials: RayOptions.check_image refused them at parse
    if image.python_package_installer == "uv":
        return {"uv": {"packages": list(image.requirements), "uv_pip_install_options": index}}
    return {"pip": {"packages": list(image.requirements), "pip_install_options": index}}


def environment(request: TaskRequest, resources: ResourceSettings, grace: float) -> dict[str, str]:
    """The job's ``runtime_env`` variables: threads, the checkpoint folder, no GPU for a task without one, the grace.

    The grace is the reaper's (``reaper.py``), and Ray's before it SIGKILLs a stopped job (a little longer). The
    user's own variables are not here: the reaper sets them over these (:func:`plan_job`'s ``environment``).
    """
    location = request.checkpoint
    provider = {
        "AIRFLOW_GPU_KILL_GRACE": f"{grace:g}",
        "RAY_JOB_STOP_WAIT_TIME_S": str(math.ceil(grace) + 3),
        **thread_environment(resources, request.processes_per_node),
        **checkpoint_environment(None if location is None else location.path),
        **({} if resources.requests_gpus else {"CUDA_VISIBLE_DEVICES": ""}),  # Ray leaves them all visible
        "PYTHONUNBUFFERED": "1",
    }
    return provider


def plan_job(request: TaskRequest, options: RayOptions, conf: GpuConfig, *, on_cpu: bool = False) -> RayPlan:
    """The job of one try (pure: no client, no cluster, no configuration read)."""
    resources = request.resources.without_gpus() if on_cpu else request.resources
    wanted, selector = resource_request(resources), label_selector(resources, options)
    grace = conf.grace(options.kill_grace)
    runtime_env: dict[str, Any] = {"env_vars": environment(request, resources, grace), **_installer(request)}
    own = with_user_environment({}, request.image.environment, resources.gpu_vendor)
    metadata = {key: str(request.labels.get(key, "")) for key in (*IDENTITY, "try_number")}
    metadata["airflow_gpu_provider"] = "true"
    if request.num_nodes > 1:
        nodes = {
            "num_nodes": request.num_nodes,
            "bundle": wanted or {"CPU": 1},
            "label_selector": selector,
            "port": request.rendezvous_port,
            "runtime": FILE_NAME,
            "envelope": ENVELOPE,
            "environment": ENVIRONMENT,
            "reaper": REAPER,
        }
        entrypoint, submit = f"python {DRIVER} {NODES}", dict[str, Any](entrypoint_num_cpus=0)
    else:
        nodes, submit = None, dict[str, Any](_entrypoint_arguments(wanted))
        entrypoint = f"python {REAPER} {FILE_NAME} {ENVELOPE} {RESULT_TO_LOG}"
        if selector:
            submit["entrypoint_label_selector"] = selector
    policy = request.missing_gpu
    plan = RayPlan(
        request=request,
        options=options,
        entrypoint=entrypoint,
        submit=submit,
        runtime_env=runtime_env,
        metadata=metadata,
        environment=own,
        nodes=nodes,
        pending_timeout=options.pending_timeout or (conf.wait_timeout if policy.waits else policy.pending_timeout),
        poll_interval=conf.poll_interval,
        on_cpu=on_cpu,
    )
    if policy.runs_on_cpu and resources.requests_gpus and not on_cpu:
        return dataclasses.replace(plan, cpu_fallback=plan_job(request, options, conf, on_cpu=True))
    return plan
