"""Why a pod did not run: the scheduler's verdict on a Pending pod, and how the main container ended.

Pure functions over the pod in its API (camelCase dict) form and the pod's event messages, so every rule is tested
on the scheduler's real message formats without a cluster, e.g.::

    0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: ...
    0/4 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}, 3 Insufficient cpu.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_gpu_provider.backends.kubernetes.kueue import waited_too_long, waiting_queue
from airflow_gpu_provider.exceptions import OOM_REMEDY, GpuTaskError, HostOutOfMemoryError

_INSUFFICIENT = re.compile(r"(\d+) Insufficient ([A-Za-z0-9./_-]+)")
_TAINT = re.compile(r"(\d+) node\(s\) had (?:untolerated )?taint \{([^}]*)\}")
_SELECTOR = re.compile(r"(\d+) node\(s\) didn't match (?:Pod's )?node (?:affinity/selector|selector)")
_HINTS = {
    "resources": "free or add capacity, or give the task more time: on_missing_gpu='wait' or a longer "
    "backend_options['pending_timeout']",
    "taint": "tolerate the taint with backend_options['tolerations'] (the GPU taint is tolerated unless "
    "gpu_toleration=False)",
    "selector": "no node carries the requested labels; check backend_options['label_scheme'], "
    "'accelerator_labels' and 'node_selector' against `kubectl get nodes --show-labels`",
}


@dataclass(frozen=True)
class Unschedulable:
    """A Pending pod the scheduler could not place.

    :param insufficient: resource name -> number of nodes that lack it
    :param taints: taints that some nodes had and the pod did not tolerate
    :param selector_mismatch: number of nodes whose labels did not match
    :param kueue_queue: the pod never reached the scheduler: it still waits for Kueue's admission in this queue
    """

    pod: str
    scheduler_message: str
    insufficient: dict[str, int] = field(default_factory=dict)
    taints: list[str] = field(default_factory=list)
    selector_mismatch: int = 0
    kueue_queue: str | None = None

    def explain(self, waited_seconds: float, requested: Mapping[str, str]) -> str:
        """One message for the task log and the raised error."""
        if self.kueue_queue is not None:
            return waited_too_long(f"Pod {self.pod}", self.kueue_queue, waited_seconds)
        parts = []
        for resource, nodes in self.insufficient.items():
            amount = requested.get(resource)
            what = f"{amount} {resource}" if amount else resource
            parts.append(f"no node has {what} free ({nodes} node(s) have too little {resource})")
        if self.taints:
            parts.append(f"untolerated taint(s) {', '.join(self.taints)}")
        if self.selector_mismatch:
            parts.append(f"{self.selector_mismatch} node(s) lack the requested node labels")
        summary = "; ".join(parts) or "the scheduler found no node for it"
        hints = [_HINTS[kind] for kind, on in self._kinds() if on]
        text = f"Pod {self.pod} stayed Pending for {waited_seconds:g}s and was deleted: {summary}."
        if self.scheduler_message:
            text += f" The scheduler said: {self.scheduler_message.strip()}"
        if hints:
            text += " What to do: " + "; ".join(hints) + "."
        return text

    def _kinds(self) -> list[tuple[str, bool]]:
        return [
            ("resources", bool(self.insufficient)),
            ("taint", bool(self.taints)),
            ("selector", bool(self.selector_mismatch)),
        ]


def _name(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', '?')}/{metadata.get('name', '?')}"


def unschedulable(pod: Mapping[str, Any], events: Sequence[str] = ()) -> Unschedulable | None:
    """The scheduler's verdict on a Pending pod, or None if it is not (yet) known to be unschedulable.

    :param pod: the pod as read from the API server, in its dict form
    :param events: messages of the pod's events (``FailedScheduling`` repeats the condition's message)
    """
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return None
    queue = waiting_queue(pod)
    if queue is not None:  # Kueue's scheduling gate: the scheduler has not seen it yet
        return Unschedulable(pod=_name(pod), scheduler_message="", kueue_queue=queue)
    conditions = [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"]
    scheduled_false = bool(conditions) and conditions[0].get("status") == "False"
    failed_scheduling = [m for m in events if "nodes are available" in m]
    if not scheduled_false and not failed_scheduling:
        return None
    message = (conditions[0].get("message") if conditions else None) or (failed_scheduling or [""])[-1]
    verdict = message.split("preemption:")[0]  # the preemption part repeats the node counts
    insufficient: dict[str, int] = {}
    for count, resource in _INSUFFICIENT.findall(verdict):
        insufficient[resource.rstrip(".,")] = insufficient.get(resource.rstrip(".,"), 0) + int(count)
    return Unschedulable(
        pod=_name(pod),
        scheduler_message=message,
        insufficient=insufficient,
        taints=[f"{{{taint}}}" for _, taint in _TAINT.findall(verdict)],
        selector_mismatch=sum(int(count) for count in _SELECTOR.findall(verdict)),
    )


def termination(pod: Mapping[str, Any], container: str) -> dict[str, Any] | None:
    """The ``state.terminated`` record of one container (``reason``, ``exitCode``, ...), if it terminated."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            state = status.get("state") or {}
            last = status.get("lastState") or {}
            return state.get("terminated") or last.get("terminated")
    return None


def termination_error(pod: Mapping[str, Any], container: str, limits: Mapping[str, str]) -> GpuTaskError | None:
    """The error of a container the kernel or kubelet killed; ``None`` for ordinary exits.

    ``OOMKilled`` is a :class:`HostOutOfMemoryError` (an ``on_oom`` ladder's memory step); any other reason a
    :class:`GpuTaskError` naming it.
    """
    record = termination(pod, container)
    if not record or record.get("reason") in (None, "Completed", "Error"):
        return None
    reason = record["reason"]
    text = f"The main container of pod {_name(pod)} was stopped: {reason} (exit code {record.get('exitCode')})."
    if reason != "OOMKilled":
        return GpuTaskError(text)
    limit = limits.get("memory")
    text += f" It used more than its memory limit ({limit})." if limit else " The node ran out of memory."
    return HostOutOfMemoryError(f"{text} {OOM_REMEDY[HostOutOfMemoryError.kind]}")
