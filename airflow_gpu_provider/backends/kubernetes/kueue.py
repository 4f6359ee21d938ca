"""Kueue admission: the labels a task's pod or Indexed Job carries, and whether one is still waiting to be admitted.

Pure (no client): parsed options, plans and the API server's answers in their dict form. The names are Kueue's own
(kubernetes-sigs/kueue v0.19.2: ``pkg/controller/constants/constants.go`` and
``pkg/controller/jobs/pod/constants/constants.go``; documented in ``site/content/en/docs/tasks/run/plain_pods.md``,
``.../tasks/run/jobs.md`` and ``.../concepts/workload_priority_class.md``):

- ``kueue.x-k8s.io/queue-name``: the LocalQueue, a label on the pod (Kueue's ``pod`` integration) or on the Job
  (its ``batch/job`` integration; Kueue leaves the pods of a Job it manages to the Job);
- ``kueue.x-k8s.io/priority-class``: the WorkloadPriorityClass, the Workload's priority in the queue, independent
  of the pod's own PriorityClass (``backend_options['priority_class_name']``, ``spec.priorityClassName``);
- ``kueue.x-k8s.io/admission``: the scheduling gate Kueue's webhook puts on a pod it manages and removes when its
  Workload is admitted. The provider never adds it: a pod with the gate and no Kueue would never be scheduled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_gpu_provider.backends.options import BadOption
from airflow_gpu_provider.backends.pods.options import DNS_SUBDOMAIN
from airflow_gpu_provider.policy.pods import PRIORITY_LABEL, QUEUE_LABEL  # what the allow-list judges (rule P3)

ADMISSION_GATE = "kueue.x-k8s.io/admission"
#: Kueue's own rule for both labels (``ValidateLabelAsCRDName``): an object name that is also a label value
ACCEPTED = "a Kueue object name: lower-case letters, digits, '-' and '.', at most 63 characters, e.g. 'team-a'"


def kueue_name(value: Any) -> str:
    """A LocalQueue or WorkloadPriorityClass name, as Kueue's webhook accepts it in its label."""
    if not isinstance(value, str) or len(value) > 63 or not DNS_SUBDOMAIN.fullmatch(value):
        raise BadOption("not a valid Kueue queue or priority class name", ACCEPTED)
    return value


def kueue_queue_name(value: Any) -> str:
    """``backend_options['kueue_queue']``: a LocalQueue name, or ``''`` for no Kueue (over the connection's)."""
    if value == "":
        return value
    try:
        return kueue_name(value)
    except BadOption as err:
        raise BadOption(err.reason, f"{ACCEPTED}; or '' for no Kueue") from None


def kueue_labels(queue: str, priority_class: str | None) -> dict[str, str]:
    """The labels that put a pod or a Job in ``queue`` (none without a queue: Kueue then leaves it alone)."""
    if not queue:
        return {}
    return {QUEUE_LABEL: queue, **({PRIORITY_LABEL: priority_class} if priority_class else {})}


def queue_the_job_only(job: dict[str, Any]) -> dict[str, Any]:
    """The Job carries the labels, its pods do not: Kueue admits the Job as one Workload, its pods with it.

    (Kueue leaves a managed Job's pods to the Job; without its ``batch/job`` integration, pods carrying the label
    would be queued one by one by the ``pod`` integration instead, each rank on its own.)
    """
    labels = job["spec"]["template"]["metadata"].get("labels") or {}
    for key in (QUEUE_LABEL, PRIORITY_LABEL):
        labels.pop(key, None)
    return job


def kueue_queue(obj: Mapping[str, Any]) -> str | None:
    """The queue a pod or Job is in (its label), or None."""
    queue = ((obj.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    return str(queue) if queue else None


def waiting_queue(obj: Mapping[str, Any]) -> str | None:
    """The queue a pod or Job waits in for Kueue's admission, or None when it is not waiting (or not Kueue's).

    A pod waits while it carries Kueue's scheduling gate; a Job while it is suspended (``spec.suspend``: Kueue
    unsuspends it on admission, and suspends it again when its Workload is preempted or evicted).
    """
    queue = kueue_queue(obj)
    spec = obj.get("spec") or {}
    if not queue:
        return None
    if obj.get("kind") == "Job" or "template" in spec:
        return queue if spec.get("suspend") else None
    gates = [gate.get("name") for gate in spec.get("schedulingGates") or []]
    return queue if ADMISSION_GATE in gates else None


def waiting_line(what: str, queue: str) -> str:
    """The task log's line for an object that waits for admission."""
    return (
        f"{what} is waiting for Kueue admission in queue {queue!r} (LocalQueue {queue!r}; "
        f"`kubectl get workloads -n <namespace>` shows its place and why it waits)"
    )


def waited_too_long(what: str, queue: str, waited: float) -> str:
    """The error of an object Kueue did not admit within ``pending_timeout``."""
    return (
        f"{what} waited {waited:g}s for Kueue admission in queue {queue!r} and was deleted: the ClusterQueue behind "
        f"LocalQueue {queue!r} had no quota free for it (or the LocalQueue does not exist, or Kueue does not manage "
        "this namespace). What to do: give the task more time (on_missing_gpu='wait' or a longer "
        "backend_options['pending_timeout']), ask for more quota, or a higher backend_options['kueue_priority_class']."
    )
