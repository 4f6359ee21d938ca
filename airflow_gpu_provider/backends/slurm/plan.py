"""The Slurm backend's plan: the batch job ``run()`` submits, decided without touching the cluster.

One task try is one batch job. :func:`plan_job` maps the request once: ``gpu_count`` to GPUs per node as GRES (a
share of one GPU to ``gres/shard``: ``shards.py``), ``memory`` to ``--mem``, ``cpu_count`` to ``--cpus-per-task``,
the task's ``execution_timeout`` to ``--time`` (whole minutes, ``placement.py``), the options to ``--partition``,
``--account``, ``--qos``, ``--reservation`` and ``--requeue``/``--no-requeue``, several machines to ``--nodes`` with
one task per node; the task's variables to the job's environment. What the cluster's facts decide (the GRES type
of an accelerator, several models as node features ``--constraint=a|b``, the nodes an earlier try failed on) is
:func:`directives`, pure too.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.backends.slurm.connection import Cluster
from airflow_gpu_provider.backends.slurm.options import SlurmOptions
from airflow_gpu_provider.backends.slurm.shards import Shards, enforcement, taken
from airflow_gpu_provider.checkpoint.location import checkpoint_environment
from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.task.environment import thread_environment, with_user_environment
from airflow_gpu_provider.task.request import TaskRequest

if TYPE_CHECKING:
    from airflow_gpu_provider.config.worker import GpuConfig
    from airflow_gpu_provider.settings.shares import GpuShare

#: what a job's comment carries of its task instance (``--comment``, JSON), with its worker and deployment
IDENTITY = ("dag_id", "task_id", "run_id", "map_index", "try_number")


@dataclass(frozen=True)
class SlurmPlan:
    """One task try as a Slurm batch job.

    :param directives: sbatch's long options (name -> value; ``""`` for a flag) but those of the cluster's facts
    :param gpus: GPUs per node (GRES), 0 for none
    :param models: the accelerator models the task accepts (the connection maps them to GRES types)
    :param environment: the job's variables (the task's and the provider's; nothing of the worker's)
    :param memory: ``--mem`` as written (for the OOM message)
    :param cpu_fallback: the same job without GPUs (``on_missing_gpu="cpu"``), or ``None``
    :param share: a share of one GPU (``gres/shard``), or ``None``: whole GPUs
    :param allow_unenforced: ``[gpu_policy] allow_unenforced_gpu_shares`` (``host/mps.py``)
    """

    request: TaskRequest
    options: SlurmOptions
    directives: dict[str, str]
    gpus: int = 0
    models: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)
    memory: str | None = None
    pending_timeout: float = 300.0
    poll_interval: float = 1.0
    grace: float = 2.0
    cpu_fallback: SlurmPlan | None = None
    on_cpu: bool = False
    share: GpuShare | None = None
    allow_unenforced: bool = False

    @property
    def try_number(self) -> str:
        """The try this plan runs, as its labels carry it (the job record names it)."""
        return str(self.request.labels.get("try_number", ""))

    @property
    def num_nodes(self) -> int:
        """Machines the job spans (one task per node)."""
        return self.request.num_nodes


def plan_job(
    request: TaskRequest,
    options: SlurmOptions,
    conf: GpuConfig,
    *,
    timeout_s: float | None = None,
    on_cpu: bool = False,
) -> SlurmPlan:
    """The job of one try (pure: no client, no cluster, no configuration read).

    :param timeout_s: the task's ``execution_timeout`` in seconds: the job's ``--time``
    """
    resources = request.resources.without_gpus() if on_cpu else request.resources
    share = resources.share
    gpus = 1 if share else int(resources.gpu_count) if resources.requests_gpus else 0  # type: ignore[arg-type]
    directives: dict[str, str] = {"job-name": f"airflow-{request.display_name}"[:120]}
    directives.update({kind: name for kind, name in options.cluster_names.items()})
    memory = None
    if resources.memory is not None:
        memory = directives["mem"] = f"{math.ceil(resources.memory / 2**20)}M"
    if resources.cpu_count is not None:
        directives["cpus-per-task"] = str(math.ceil(resources.cpu_count))
    if request.num_nodes > 1:
        directives.update({"nodes": str(request.num_nodes), "ntasks-per-node": "1"})
    directives["requeue" if options.requeue else "no-requeue"] = ""
    grace = conf.grace(options.kill_grace)
    provider = {
        "AIRFLOW_GPU_KILL_GRACE": f"{grace:g}",
        **thread_environment(resources, request.processes_per_node),
        **checkpoint_environment(None if request.checkpoint is None else request.checkpoint.path),
        **({} if gpus else {"CUDA_VISIBLE_DEVICES": ""}),  # Slurm sets it for a job with GPUs: none here
        "PYTHONUNBUFFERED": "1",
    }
    policy = request.missing_gpu
    plan = SlurmPlan(
        request=request,
        options=options,
        directives=directives,
        gpus=gpus,
        models=tuple(resources.accelerators) if gpus else (),
        environment=with_user_environment(provider, request.image.environment, resources.gpu_vendor),
        memory=memory,
        pending_timeout=options.pending_timeout or (conf.wait_timeout if policy.waits else policy.pending_timeout),
        poll_interval=conf.poll_interval,
        grace=grace,
        on_cpu=on_cpu,
        share=share,
        allow_unenforced=conf.allow_unenforced_gpu_shares,
    )
    if policy.runs_on_cpu and gpus and not on_cpu:
        cpu = plan_job(request, options, conf, on_cpu=True)
        return dataclasses.replace(plan, cpu_fallback=cpu)
    return plan


def gres(plan: SlurmPlan, cluster: Cluster) -> dict[str, str]:
    """``--gres`` (and ``--constraint`` for several models) of the plan's GPUs on this cluster."""
    if not plan.gpus:
        return {}
    if plan.share is not None:
        return _shares(plan, cluster)[1].gres
    types = [kind for kind in map(cluster.gres_type, plan.models) if kind is not None]  # a list: any one of them
    if plan.models and not types:
        known = ", ".join(sorted(cluster.accelerators)) or "none"
        raise GpuTaskError(
            f"accelerator {' or '.join(map(repr, plan.models))} has no GRES type in the Slurm connection "
            f"{cluster.name!r}'s accelerators map (it maps {known}): the admin adds it there (docs/slurm.md)."
        )
    types = list(dict.fromkeys(types))
    if len(types) == 1:
        return {"gres": f"gpu:{types[0]}:{plan.gpus}"}
    found = {"gres": f"gpu:{plan.gpus}"}
    return {**found, "constraint": "|".join(types)} if types else found


def directives(
    plan: SlurmPlan, cluster: Cluster, *, folder: str, comment: str, avoid: tuple[str, ...] = ()
) -> dict[str, str]:
    """Every directive of the job on this cluster: the plan's, its GRES, its files, its comment, the nodes avoided.

    :param folder: the job's folder on the shared folder (its output is written there)
    :param avoid: nodes that fit (:func:`fitting_nodes`) but that an earlier try failed on: excluded
    """
    found = {**plan.directives, **gres(plan, cluster), "chdir": folder, "comment": comment}
    found.update({"output": f"{folder}/output.log", "open-mode": "append"})
    if avoid:
        found["exclude"] = ",".join(avoid)
    return found


def job_share(plan: SlurmPlan, cluster: Cluster, log: logging.Logger) -> dict[str, Any] | None:
    """The summary's ``share`` of the plan's job (``None``: whole GPUs), its enforcement said in the worker's log.

    :raises GpuUnavailableError: a command on a share, and the admin does not allow unenforced shares
    """
    if plan.share is None:
        return None
    share, shards, right_sized = _shares(plan, cluster)
    if right_sized is not None:
        log.info("[gpu] %s", right_sized)
    command = plan.request.envelope.mode == "command"
    found = enforcement(share, shards, command=command, allow_unenforced=plan.allow_unenforced)
    log.info("[gpu] %s", found.share["line"])
    return dict(found.share)


def _shares(plan: SlurmPlan, cluster: Cluster) -> tuple[GpuShare, Shards, str | None]:
    """The plan's share (a right-sized try's, ``right_size=True``), its shards and the right-size line."""
    assert plan.share is not None
    need = (plan.request.right_size or {}).get("need")
    return taken(plan.share, plan.models, cluster, None if need is None else int(need))
