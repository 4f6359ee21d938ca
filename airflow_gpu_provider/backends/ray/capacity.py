"""Whether the Ray cluster could ever run a job: its nodes' totals and labels, read through Ray's state API.

Ray keeps a job it cannot place pending, whether its resources are busy or no node has them: that is ``wait``.
For ``fail`` and ``cpu``, a job no node could ever run is told at once, naming what the cluster has (Ray's own
state API, ``ray.util.state.list_nodes``); a busy cluster is told after ``pending_timeout``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.backends.ray.plan import RayPlan, label_selector, resource_request
from airflow_gpu_provider.settings.units import format_bytes

if TYPE_CHECKING:
    from airflow_gpu_provider.backends.ray.connection import Endpoint


def label_matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    """Ray's label selector: ``v``, ``!v``, ``in(a,b)``, ``!in(a,b)``."""
    for key, wanted in selector.items():
        negated = wanted.startswith("!")
        body = wanted[1:] if negated else wanted
        choices = [c.strip() for c in body[3:-1].split(",")] if body.startswith("in(") else [body]
        if (labels.get(key) in choices) == negated:
            return False
    return True


def _describe(node: Any) -> str:
    total = dict(node.resources_total or {})
    parts = [f"{total.get(name, 0):g} {name}" for name in ("GPU", "CPU") if name in total or name == "GPU"]
    parts += [f"{total[k]:g} {k}" for k in total if k in ("neuron_cores", "TPU")]
    if "memory" in total:
        parts.append(f"{format_bytes(total['memory'])} memory")
    labels = {k: v for k, v in (node.labels or {}).items() if not k.startswith("ray.io/node")}
    return f"{node.node_ip} ({str(node.node_id)[:8]}): {', '.join(parts)}" + (f", labels {labels}" if labels else "")


def infeasible(endpoint: Endpoint, plan: RayPlan) -> str | None:
    """Why no node (or too few, on several machines) could ever run the job; ``None`` when some could, or unknown."""
    try:
        from ray.util.state.common import ListApiOptions, StateResource

        options = ListApiOptions(limit=10_000, timeout=15)
        found = endpoint.state().list(StateResource.NODES, options=options, raise_on_missing_output=False)
        nodes = [n for n in found if n.state == "ALIVE"]
    except Exception:  # noqa: BLE001 - the state API is not every endpoint's (a proxy): Ray decides alone then
        return None
    resources = plan.request.resources
    wanted, selector = resource_request(resources), label_selector(resources, plan.options)
    fits = [
        n
        for n in nodes
        if all((n.resources_total or {}).get(k, 0) >= v for k, v in wanted.items())
        and label_matches(n.labels or {}, selector)
    ]
    if len(fits) >= plan.request.num_nodes:
        return None
    where = f" on {plan.request.num_nodes} nodes" if plan.request.num_nodes > 1 else ""
    asked = resources.describe() + (f" with labels {selector}" if selector else "")
    have = "; ".join(_describe(n) for n in nodes) or "no node"
    return f"Requested {asked}{where} but the Ray cluster has {len(fits)} node(s) that could run it: {have}"
