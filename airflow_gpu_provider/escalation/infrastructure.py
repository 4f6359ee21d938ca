"""A try that failed because of the infrastructure: said so, remembered, avoided, and run again where allowed.

Whatever found it (the runtime: an Xid, an ECC error, an NCCL timeout; the Kubernetes backend: a pod evicted,
preempted, lost with its node, an image pull), the error carries one ``gpu_failure`` record
(:attr:`~airflow_gpu_provider.exceptions.GpuTaskError.failure`). :func:`report` logs it as one ERROR line, pushes it
to XCom under :data:`XCOM_KEY` and keeps its node in the task instance's task state store (:data:`KEY`, as the OOM
history is kept: :mod:`.store`), which the next try reads (:func:`avoided_nodes`) to keep its pod off that node. The
local and Docker backends quarantine the failing GPU themselves (``host/quarantine.py``).

:func:`run_again` is ``[gpu] infra_retries``: Airflow 3.3 has no failure class an operator can set, but a task may
ask to be rescheduled (``AirflowRescheduleException``): the task instance is ``up_for_reschedule`` and runs again with
the same try number, so the task's ``retries`` are not used (Airflow reschedules a task whose DAG could not be
loaded the same way). ``context["task_reschedule_count"]`` counts them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from airflow_gpu_provider.runtime.protocol import INFRASTRUCTURE

KEY = "airflow_gpu_provider.avoid_nodes"
XCOM_KEY = "gpu_failure"
MAX_NODES = 16  # the nodes the next try avoids: the latest ones
_NODE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a node's name (a DNS subdomain)
log = logging.getLogger(__name__)


def failure_of(error: BaseException | None) -> dict[str, Any] | None:
    """The ``gpu_failure`` record of an error, when the infrastructure is why it failed."""
    failure = getattr(error, "failure", None)
    return dict(failure) if isinstance(failure, Mapping) and failure.get("class") == INFRASTRUCTURE else None


def describe(failure: Mapping[str, Any]) -> str:
    """The one log line of an infrastructure failure: its reason, where, which GPUs, and the evidence."""
    where = failure.get("node") or failure.get("host")
    gpus = ", ".join(str(gpu.get("uuid") or gpu.get("index")) for gpu in failure.get("gpus") or [])
    line = f"[gpu] infrastructure failure: {failure.get('reason')}"
    line += f" on {where}" if where else ""
    line += f" (GPU {gpus})" if gpus else ""
    evidence = "; ".join(str(item) for item in failure.get("evidence") or [])
    return f"{line}: {evidence}" if evidence else line


def report(context: Mapping[str, Any], failure: Mapping[str, Any], task_log: Any, *, avoid_node: bool) -> None:
    """Say so in the log (ERROR) and in XCom (``gpu_failure``); keep the node for the next try to avoid.

    :param avoid_node: the backend's pods are placed on nodes (Kubernetes): the next try avoids this one
    """
    task_log.error("%s", describe(failure))
    context["ti"].xcom_push(XCOM_KEY, dict(failure))
    node, store = failure.get("node"), context.get("task_state_store")
    if not avoid_node or not node or store is None or not _NODE.fullmatch(str(node)):
        return
    nodes = [name for name in avoided_nodes(context) if name != node][-(MAX_NODES - 1) :]
    store.set(KEY, [*nodes, str(node)])


def avoided_nodes(context: Mapping[str, Any]) -> tuple[str, ...]:
    """The nodes where earlier tries of this task instance failed because of the infrastructure (checked names)."""
    store = context.get("task_state_store")
    stored = None if store is None else store.get(KEY, default=None)
    if not isinstance(stored, list):
        return ()
    nodes = tuple(str(name) for name in stored[-MAX_NODES:] if isinstance(name, str) and _NODE.fullmatch(name))
    if len(nodes) != len(stored[-MAX_NODES:]):
        log.warning("[gpu] entries of %s that are not node names were ignored", KEY)
    return nodes


def run_again(context: Mapping[str, Any], retries: int, task_log: Any) -> None:
    """Reschedule the try at once (``AirflowRescheduleException``) while ``[gpu] infra_retries`` allows."""
    done = int(context.get("task_reschedule_count") or 0)
    if done >= retries:
        if retries:
            task_log.error("[gpu] infra_retries (%d) used up: the failure counts as a try of the task", retries)
        return
    from airflow.exceptions import AirflowRescheduleException

    task_log.warning(
        "[gpu] running the task again without using one of its retries ([gpu] infra_retries: %d of %d)",
        done + 1,
        retries,
    )
    raise AirflowRescheduleException(datetime.now(timezone.utc))
