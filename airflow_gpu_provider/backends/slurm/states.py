"""What Slurm says of a job, read once: its state, why it waits, and how it ended, as the provider's classes.

Pure: no client. Both paths give the same job record (``squeue --json`` and slurmrestd's ``/jobs`` share Slurm's
data parser), read by :func:`job_info`. A pending job's reason is explained in words (:func:`pending_reason`), and
one no cluster change will ever start is told apart (:func:`never_starts`). An ended job's state is its class
(:func:`ended_error`): ``OUT_OF_MEMORY`` the OOM ladder's next memory rung, ``TIMEOUT``, ``PREEMPTED``,
``NODE_FAIL`` and ``BOOT_FAIL`` the infrastructure (``GpuRetryPolicy``; the next try avoids the node), a
``CANCELLED`` that this task did not ask for said as such; the task's own failures come from its result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_gpu_provider.exceptions import OOM_REMEDY, GpuInfrastructureError, GpuTaskError, HostOutOfMemoryError
from airflow_gpu_provider.runtime.protocol import INFRASTRUCTURE

#: states of a job that may still run (a requeued job passes through them again, with the same id)
ACTIVE = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
     "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
)  # fmt: skip
#: ended states that say the infrastructure, not the task, is why (the next try avoids the node)
INFRASTRUCTURE_STATES = {
    "TIMEOUT": "the job reached its time limit (--time, or the partition's)",
    "PREEMPTED": "the job was preempted by a job of higher priority",
    "NODE_FAIL": "a node of the job failed (or was set down)",
    "BOOT_FAIL": "a node of the job failed to boot",
}
#: why a job waits, by the start of Slurm's reason (squeue's %r): what it means to the task's author
PENDING_REASONS = (
    ("Resources", "for the resources it asks for (busy now)"),
    ("Priority", "behind jobs of higher priority"),
    ("Dependency", "for a job it depends on"),
    ("BeginTime", "for its begin time (a requeued job starts again after a few seconds)"),
    ("JobHeld", "held (scontrol release lets it start)"),
    ("Held", "held"),
    ("QOS", "for a limit of its QoS"),
    ("Assoc", "for a limit of its account (association)"),
    ("Partition", "for a limit or the state of its partition"),
    ("ReqNodeNotAvail", "for nodes that are down, drained or reserved"),
    ("NodeDown", "for a node that is down"),
    ("Reservation", "for its reservation"),
    ("Licenses", "for licenses"),
    ("Cleaning", "while Slurm cleans up after its earlier run"),
)
#: reasons no change of load will ever end
NEVER = ("BadConstraints", "DependencyNeverSatisfied", "InvalidQOS", "InvalidAccount", "PartitionConfig")


@dataclass(frozen=True)
class JobInfo:
    """One job as Slurm reports it.

    :param status: the exit status of its batch script (``None`` when a signal ended it)
    :param signal: the signal that ended it, else 0
    :param script: its batch script's path as Slurm keeps it (set at submit; the job's owner cannot change it)
    """

    job_id: str
    state: str
    reason: str = ""
    nodes: str = ""
    batch_host: str = ""
    status: int | None = 0
    signal: int = 0
    restarts: int = 0
    comment: str = ""
    script: str = ""

    @property
    def active(self) -> bool:
        """Whether it may still run."""
        return self.state in ACTIVE

    @property
    def node(self) -> str:
        """The node it ran on (its batch host, the first node of several), or ``""``."""
        return self.batch_host or self.nodes


def job_info(raw: Mapping[str, Any]) -> JobInfo:
    """A job of ``squeue --json`` or slurmrestd's ``/jobs`` (v0.0.37, v0.0.38: the same fields)."""
    state = raw.get("job_state") or ""
    if isinstance(state, list):  # later versions give a list of flags
        state = state[0] if state else ""
    code = raw.get("exit_code")
    code = int(code) if isinstance(code, int) else 0  # the wait status: exit status << 8 | signal
    return JobInfo(
        job_id=str(raw.get("job_id", "")),
        state=str(state).upper(),
        reason=str(raw.get("state_reason") or ""),
        nodes=str(raw.get("nodes") or ""),
        batch_host=str(raw.get("batch_host") or ""),
        status=None if code & 0x7F else code >> 8,
        signal=code & 0x7F,
        restarts=int(raw.get("restart_cnt") or 0),
        comment=str(raw.get("comment") or ""),
        script=str(raw.get("command") or ""),
    )


def pending_reason(reason: str) -> str:
    """Why a pending job waits, in words (Slurm's own reason with it)."""
    for start, words in PENDING_REASONS:
        if reason.startswith(start):
            return f"waits {words} ({reason})"
    return f"waits ({reason or 'no reason given yet'})"


def never_starts(reason: str) -> bool:
    """Whether a pending job's reason says no change of load will ever start it."""
    return reason.startswith(NEVER)


def ended_error(info: JobInfo, *, cancelled_here: bool, memory: str | None) -> GpuTaskError | None:
    """The error of a job's end that its state alone explains; ``None`` when its result tells (or it succeeded).

    :param cancelled_here: this task cancelled it (``on_kill``, a timeout): its own error says so
    :param memory: the job's ``--mem``, for the OOM message
    """
    where = f"Slurm job {info.job_id}" + (f" on {info.node}" if info.node else "")
    if info.state == "OUT_OF_MEMORY":
        limit = f" (--mem={memory})" if memory else ""
        return HostOutOfMemoryError(
            f"{where} ran out of memory{limit}: Slurm ended it OUT_OF_MEMORY. {OOM_REMEDY[HostOutOfMemoryError.kind]}"
        )
    if info.state in INFRASTRUCTURE_STATES:
        reason = INFRASTRUCTURE_STATES[info.state]
        failure = {
            "class": INFRASTRUCTURE,
            "reason": f"Slurm {info.state}",
            "evidence": [f"{where} ended {info.state}: {reason}"],
            "node": info.node.split(",")[0],
        }
        return GpuInfrastructureError(
            f"{where} ended {info.state}: {reason}; not the task's code. The next try runs a new job, off that node "
            "where another fits.",
            failure=failure,
        )
    if info.state == "CANCELLED" and not cancelled_here:
        return GpuTaskError(
            f"{where} was cancelled outside this task (scancel by a user or an admin, or the job's deadline): "
            "it is not the task's failure, and its result is lost."
        )
    if info.state in ("DEADLINE", "CANCELLED"):
        return GpuTaskError(f"{where} ended {info.state} before it gave a result.")
    return None
