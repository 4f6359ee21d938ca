"""Where the history of a task instance's tries lives between its tries: an Airflow Variable, through the Task SDK.

The next try may run on another worker host, and a task instance's XComs are cleared when its next try starts, so
the history goes to the metadata DB. One Variable per task instance, deleted when the task succeeds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

VARIABLE_PREFIX = "airflow_gpu_provider.oom."


def variable_key(labels: Mapping[str, str]) -> str:
    """The Variable of one task instance's history (any length of ids, one key of bounded length)."""
    identity = json.dumps([labels.get(k, "") for k in ("dag_id", "run_id", "task_id", "map_index")])
    return VARIABLE_PREFIX + hashlib.sha256(identity.encode()).hexdigest()[:32]


def load(labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """The history of the task instance's earlier tries (empty for the first)."""
    from airflow.sdk import Variable

    stored = Variable.get(variable_key(labels), default=None, deserialize_json=True)
    return list(stored.get("tries", [])) if isinstance(stored, dict) else []


def save(labels: Mapping[str, str], history: Sequence[Mapping[str, Any]]) -> None:
    """Keep the history for the next try, wherever it runs."""
    from airflow.sdk import Variable

    ids = {k: labels.get(k) for k in ("dag_id", "run_id", "task_id", "map_index")}
    Variable.set(variable_key(labels), {**ids, "tries": list(history)}, serialize_json=True)


def forget(labels: Mapping[str, str]) -> None:
    """The task succeeded: its history is no longer needed."""
    from airflow.sdk import Variable

    Variable.delete(variable_key(labels))
