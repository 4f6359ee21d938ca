"""The node driver of a task on several machines: the Ray job's entrypoint there, run on the cluster (imports ``ray``).

Shipped in the job's ``working_dir`` beside the runtime archive, the envelope and ``nodes.json``; it imports nothing
of the provider. It takes the envelope and the task's variables out of the ``working_dir`` at once and hands them
to each rank (Ray's object store), which writes them into a private folder for its reaper. It reserves one bundle
per node in a ``STRICT_SPREAD`` placement group (Ray's scheduling, with the task's label selector on every bundle),
finds the first node's address and a free port there (the rendezvous),
then runs the runtime on every bundle, as a Ray task holding the bundle's resources, with ``NODE_RANK``,
``NUM_NODES``, ``MASTER_ADDR`` and ``MASTER_PORT`` (the launcher's rank arguments). Its last line is the result: rank
0's, or the error of the node that failed first (the other nodes are then stopped). The placement group is removed
on every path (and by Ray with the job, should the driver be killed).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
from typing import Any

MARKER = "[gpu] result: "  # runtime/protocol.py RESULT_MARKER
try:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError:  # the job runs the node's first `python` on the PATH of `ray start`: not always Ray's own
    _why = (
        f"[gpu] error: the node driver of a task on several machines needs Ray, which this Ray node's Python cannot "
        f"import: {sys.executable} (Python {platform.python_version()}) on {socket.gethostname()}. Start Ray from "
        "the environment that has Ray and the task's packages (docs/ray.md)."
    )
    print(_why, flush=True)
    print(MARKER + json.dumps({"ok": False, "error": {"type": "ImportError", "kind": "error", "message": _why[13:]}}))
    sys.exit(2)
#: a rank's reaper (and so its runtime) gets SIGTERM when the Ray worker that started it dies
_DIE_WITH_WORKER = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def _strategy(group: Any, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)


@ray.remote(num_cpus=0)
def _rendezvous(port: int | None) -> tuple[str, int]:
    """On the first node: its address, and a free port there (unless the task chose one)."""
    if port:
        return ray.util.get_node_ip_address(), port
    with socket.socket() as probe:
        probe.bind(("", 0))
        return ray.util.get_node_ip_address(), int(probe.getsockname()[1])


def _take(name: str) -> str:
    """A file of the ``working_dir`` (this node's copy), read and removed."""
    with open(name, encoding="utf-8") as handle:
        content = handle.read()
    os.unlink(name)
    return content


@ray.remote(max_retries=0)
def _rank(rank: int, spec: dict[str, Any], files: dict[str, str], address: str, port: int) -> dict[str, Any]:
    """One node's runtime, to its end: its exit status, its result envelope, the node it ran on."""
    for name in files:  # this node's copy of the working_dir keeps neither
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
    environment = {
        **os.environ,
        "NODE_RANK": str(rank),
        "NUM_NODES": str(spec["num_nodes"]),
        "MASTER_ADDR": address,
        "MASTER_PORT": str(port),
    }
    with tempfile.TemporaryDirectory(prefix="airflow-gpu-node-") as folder:
        result_file = os.path.join(folder, "result.json")
        for name, content in files.items():
            with os.fdopen(os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT, 0o600), "w") as handle:
                handle.write(content)
        envelope = os.path.join(folder, spec["envelope"])
        argv = [sys.executable, "-c", _DIE_WITH_WORKER, spec["reaper"], spec["runtime"], envelope, result_file]
        status = subprocess.run(argv, env=environment, check=False).returncode
        result = None
        if os.path.exists(result_file):
            with open(result_file, encoding="utf-8") as handle:
                result = json.load(handle)
    return {"rank": rank, "status": status, "result": result, "node": ray.get_runtime_context().get_node_id()}


def _failed(outcome: dict[str, Any]) -> bool:
    return bool(outcome["status"] != 0 or not (outcome["result"] or {}).get("ok", False))


def _outcomes(ranks: list[Any]) -> dict[str, Any]:
    """Rank 0's result, or that of the node that failed first; once one fails, the others are stopped.

    As a Job with backoffLimit 0 ends its pods: otherwise a node whose ranks are done waits out torch elastic's exit
    barrier (300 s) for the failed node's agent, and the task's failure is reported minutes late.
    """
    pending, outcomes = list(ranks), []
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        outcomes.append(ray.get(done[0]))
        if _failed(outcomes[-1]) and pending:
            print(f"[gpu] node {outcomes[-1]['rank']} failed: stopping the other nodes", flush=True)
            for ref in pending:
                ray.cancel(ref, force=True)  # the rank's Ray worker dies, and with it its runtime (prctl above)
            ray.wait(pending, num_returns=len(pending), timeout=60)
            break
    failed = [o for o in outcomes if _failed(o)]
    chosen = failed[0] if failed else next(o for o in outcomes if o["rank"] == 0)
    result = chosen["result"] or {"ok": False, "exit_status": chosen["status"] or 1}
    return {**result, "node": chosen["node"], "node_rank": chosen["rank"]}


def main(spec_file: str) -> int:
    """Reserve the nodes, run a rank on each, print the result; remove the placement group on every path."""
    with open(spec_file, encoding="utf-8") as handle:
        spec = json.load(handle)
    files = {spec[key]: _take(spec[key]) for key in ("envelope", "environment")}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped job: the finally below still runs
    ray.init()
    count, bundle = int(spec["num_nodes"]), dict(spec["bundle"])
    selector = spec.get("label_selector") or {}
    group = placement_group(
        [bundle] * count, strategy="STRICT_SPREAD", bundle_label_selector=[selector] * count if selector else None
    )
    try:
        try:
            ray.get(group.ready(), timeout=float(spec.get("pending_timeout") or 300))
        except ray.exceptions.GetTimeoutError:
            print(
                f"[gpu] The cluster has no {count} nodes with {bundle} free at once"
                f"{f' and labels {selector}' if selector else ''} (STRICT_SPREAD: one bundle per node) after "
                f"{spec.get('pending_timeout')}s.",
                flush=True,
            )
            print(MARKER + json.dumps({"ok": False, "exit_status": 3}), flush=True)
            return 3
        address, port = ray.get(_rendezvous.options(scheduling_strategy=_strategy(group, 0)).remote(spec.get("port")))
        print(f"[gpu] {count} nodes reserved (STRICT_SPREAD); rendezvous {address}:{port}", flush=True)
        custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")}
        ranks = [
            _rank.options(
                num_cpus=bundle.get("CPU", 0),
                num_gpus=bundle.get("GPU", 0),
                memory=bundle.get("memory"),
                resources=custom or None,
                scheduling_strategy=_strategy(group, index),
            ).remote(index, spec, files, address, port)
            for index in range(count)
        ]
        result = _outcomes(ranks)
        print(MARKER + json.dumps(result), flush=True)
        return 0 if result.get("ok") else 1
    finally:
        remove_placement_group(group)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
