"""Who a task try is, and how the provider marks what it creates: one name for labels, annotations and logs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The provider's name in every label it writes: Docker labels ``airflow-gpu-provider.<key>``, Kubernetes labels
#: and annotations ``airflow-gpu-provider/<key>``, ``app.kubernetes.io/managed-by``.
PROVIDER = "airflow-gpu-provider"
MANAGED_BY = {"app.kubernetes.io/managed-by": PROVIDER}
#: The labels that name one task try (also KubernetesPodOperator's labels of its pod)
TRY_IDENTITY = ("dag_id", "task_id", "run_id", "try_number", "map_index")


def docker_label(key: str) -> str:
    """A Docker label of the provider: ``airflow-gpu-provider.<key>`` (Docker's reverse-DNS-ish dotted form)."""
    return f"{PROVIDER}.{key}"


def kubernetes_label(key: str) -> str:
    """A Kubernetes label or annotation key of the provider: ``airflow-gpu-provider/<key>``."""
    return f"{PROVIDER}/{key}"


def task_labels(ti: Any) -> dict[str, str]:
    """The identity of a task try, from its task instance: ``TaskRequest.labels``."""
    return {name: str(getattr(ti, name, -1 if name == "map_index" else None)) for name in TRY_IDENTITY}


def display_name(labels: Mapping[str, str]) -> str:
    """``dag.task`` (plus map index), for log lines and lock holders."""
    name = f"{labels.get('dag_id', '?')}.{labels.get('task_id', '?')}"
    if labels.get("map_index", "-1") not in ("-1", ""):
        name += f"[{labels['map_index']}]"
    return name
