"""Where the next try goes after an infrastructure failure, and how long a job may run: the two facts of a submit.

``avoid_nodes`` (the nodes earlier tries of the task instance failed on: ``escalation/infrastructure.py``) become
``--exclude`` only where another node of the partition fits the request (its configured GRES hold it, and it is up):
on a cluster whose only fitting node failed, the next try waits for that node's return instead of never starting.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from airflow_gpu_provider.backends.slurm.connection import Cluster
from airflow_gpu_provider.backends.slurm.plan import SlurmPlan, gres

DOWN = ("down", "drain", "fail", "not_responding", "future")


def time_limit(seconds: float | None) -> dict[str, str]:
    """``--time`` of the task's ``execution_timeout`` (whole minutes, at least one); none without a timeout."""
    return {} if seconds is None else {"time": str(max(1, math.ceil(seconds / 60)))}


def fitting_nodes(nodes: list[dict[str, Any]], partition: str | None, gres_wanted: str) -> list[str]:
    """The nodes of ``partition`` (any, when ``None``) whose configured GRES holds ``gres_wanted`` (``gpu[:t]:n``)."""
    kind, count = (gres_wanted.split(":")[1:-1] or [""])[0], int(gres_wanted.rsplit(":", 1)[-1] or 0)
    found = []
    for node in nodes:
        if partition is not None and partition not in (node.get("partitions") or []):
            continue
        have = 0
        for item in str(node.get("gres") or "").split(","):
            parts = item.split("(")[0].split(":")
            if parts[0] == "gpu" and (not kind or (len(parts) == 3 and parts[1] == kind)):
                have += int(parts[-1]) if parts[-1].isdigit() else 0
        if have >= count:
            found.append(str(node.get("name")))
    return found


def _up(node: dict[str, Any]) -> bool:
    flags = [str(node.get("state") or "").lower(), *(str(f).lower() for f in node.get("state_flags") or [])]
    return not any(flag.startswith(DOWN) for flag in flags)


def avoided(plan: SlurmPlan, nodes: list[dict[str, Any]], facts: Cluster, log: logging.Logger) -> tuple[str, ...]:
    """The nodes the job excludes: those earlier tries failed on, where another node fits.

    :param nodes: the cluster's nodes (``sinfo --json``'s, or slurmrestd's: the same fields)
    """
    avoid = plan.request.avoid_nodes
    if not avoid:
        return ()
    wanted = gres(plan, facts).get("gres", "gpu:0")
    fits = fitting_nodes(nodes, plan.options.partition, wanted)
    up = {str(node.get("name")) for node in nodes if _up(node)}
    excluded = tuple(node for node in avoid if node in fits)
    others = [node for node in fits if node not in excluded and node in up]
    if not others:
        log.warning(
            "An earlier try failed on %s, but no other node fits this job: it waits for that node's return",
            ", ".join(avoid),
        )
        return ()
    log.info("An earlier try failed on %s: this job avoids it (another node fits)", ", ".join(excluded))
    return excluded
