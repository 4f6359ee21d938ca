"""A queue of one-GPU tasks under a real scheduler vs the same work as plain ``@task`` in a pool of the same size.

A real Airflow runs in a throw-away home (SQLite): API server, DAG processor, scheduler with the LocalExecutor
(``--parallelism``, 8 by default) and a triggerer. ``--gpus`` GPUs (4) are listed by hand (``[gpu] devices =
0,1,2,3``: fake ids, which the local backend takes like real ones) and ``[gpu] pool = gpu`` with ``[gpu] inventory =
*=4`` gives the GPU pool. Two DAGs, each ``--tasks`` (32) mapped tasks whose function sleeps ``--seconds`` (1.5):

- **gpu**: ``@task.gpu(gpu_count=1)`` (the local backend: a child process holding one GPU's lock; the task joins the
  GPU pool with one slot);
- **plain**: ``@task(pool="plain")`` in a pool of as many slots as GPUs (the function runs in Airflow's task process).

Each function returns when it started and ended (``time.time()``) and, for the GPU task, which GPU it had
(``CUDA_VISIBLE_DEVICES``). From those: the **makespan** (the DAG run's start to its end, as the scheduler records
them), the **busy share** (the functions' seconds over GPUs x makespan) and the **idle gap** on each GPU: from one
task's end to the next task's start on the same GPU (the plain pool has no GPU ids: a task's slot is the one freed
longest ago when it started, i.e. the k-th end pairs with the (k + slots)-th start; the GPU contender is given that
pairing too, like for like).

Where the GPU task's gap goes (``--breakdown``, on by default): for each pair of tasks that followed each other on
a GPU, from the task logs and the metadata DB: the first task's function end, its GPU lock released (the lock file
leaves ``/proc/locks``, sampled every 10 ms), its task instance ``success`` (``end_date``: the pool slot is free),
the next task queued (``queued_dttm``), ``running`` (``start_date``), its ``execute`` (the end of Airflow's "Pre
Execute" in its log), its task process started on the GPU (the provider's log line), and its function's start.

A warm-up run of each DAG comes first; then ``--rounds`` (3) rounds, the contenders' order alternating (ABBA).
Everything started is stopped and removed at the end, on every path.

    python benchmarks/gpu_queue.py [--tasks 32] [--seconds 1.5] [--gpus 4] [--rounds 3] [--parallelism 8]
    python benchmarks/gpu_queue.py --quick      # 12 tasks of 1 s, 2 rounds: under 3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _airflow import Airflow
from _common import REPO

#: one DAG file per contender, so that each parses only what it uses; ``{size}``: ``--tasks``, and the warm-up's
DAG_FILES = {
    "gpu": """
import datetime

from airflow.sdk import DAG, task

for _suffix, _tasks in (("", {tasks}), ("_warmup", {gpus})):
    with DAG(f"{prefix}_gpu{{_suffix}}", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False,
             max_active_tasks=256):

        @task.gpu(gpu_count=1)
        def on_a_gpu(index, seconds):
            import os
            import time

            started = time.time()
            time.sleep(seconds)
            return {{"started": started, "ended": time.time(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}}

        on_a_gpu.partial(seconds={seconds}).expand(index=list(range(_tasks)))
""",
    "plain": """
import datetime

from airflow.sdk import DAG, task

for _suffix, _tasks in (("", {tasks}), ("_warmup", {gpus})):
    with DAG(f"{prefix}_plain{{_suffix}}", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False,
             max_active_tasks=256):

        @task(pool="plain")
        def in_a_pool(index, seconds):
            import time

            started = time.time()
            time.sleep(seconds)
            return {{"started": started, "ended": time.time(), "gpu": None}}

        in_a_pool.partial(seconds={seconds}).expand(index=list(range(_tasks)))
""",
}

CONTENDERS = ("gpu", "plain")


def stamp(value: str | None) -> float | None:
    """Seconds since the epoch of a timestamp as the metadata DB (SQLite) stores it."""
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).replace(tzinfo=datetime.UTC).timestamp()


class LockWatch(threading.Thread):
    """When each GPU's lock file leaves ``/proc/locks`` (a release), sampled every ``tick`` seconds."""

    def __init__(self, lock_files: dict[str, str], tick: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.lock_files, self.tick = lock_files, tick
        self.releases: dict[str, list[float]] = {gpu: [] for gpu in lock_files}
        self._done = threading.Event()

    def run(self) -> None:
        from airflow_gpu_provider.host.waiting import free_count

        held = dict.fromkeys(self.lock_files, False)
        while not self._done.is_set():
            now = time.time()
            for gpu, path in self.lock_files.items():
                busy = free_count([path]) == 0
                if held[gpu] and not busy:
                    self.releases[gpu].append(now)
                held[gpu] = busy
            self._done.wait(self.tick)

    def stop(self) -> None:
        self._done.set()
        self.join()


class Bench:
    def __init__(self, airflow: Airflow, prefix: str) -> None:
        self.airflow, self.prefix, self.runs = airflow, prefix, 0

    def run_dag(self, name: str, timeout: float) -> dict[str, Any]:
        """Trigger a DAG, wait for its run to succeed; its tasks' rows and return values."""
        self.runs += 1
        dag_id, run_id = f"{self.prefix}_{name}", f"bench_{self.runs}"
        self.airflow.run("dags", "trigger", dag_id, "--run-id", run_id)

        def state() -> str | None:
            rows = self.airflow.query("SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", dag_id, run_id)
            return rows[0][0] if rows and rows[0][0] in ("success", "failed") else None

        if self.airflow.wait(state, timeout, f"{dag_id} {run_id}") != "success":
            raise RuntimeError(f"{dag_id} {run_id} failed:\n{self.airflow.logs()}")
        ((started, ended),) = self.airflow.query(
            "SELECT start_date, end_date FROM dag_run WHERE dag_id = ? AND run_id = ?", dag_id, run_id
        )
        tasks = {}
        for map_index, queued, start, end in self.airflow.query(
            "SELECT map_index, queued_dttm, start_date, end_date FROM task_instance WHERE dag_id = ? AND run_id = ?",
            dag_id,
            run_id,
        ):
            tasks[map_index] = {"queued": stamp(queued), "running": stamp(start), "success": stamp(end)}
        for map_index, value in self.airflow.query(
            "SELECT map_index, value FROM xcom WHERE dag_id = ? AND run_id = ? AND key = 'return_value'",
            dag_id,
            run_id,
        ):
            decoded = value
            while isinstance(decoded, (str, bytes)):  # JSON, perhaps of a JSON string
                decoded = json.loads(decoded)
            tasks[map_index].update(decoded)
        return {"dag_id": dag_id, "run_id": run_id, "start": stamp(started), "end": stamp(ended), "tasks": tasks}

    def log_events(self, dag_id: str, run_id: str, map_index: int) -> list[tuple[float, str]]:
        folder = self.airflow.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        lines = []
        for path in folder.glob(f"task_id=*/map_index={map_index}/attempt=1.log"):
            for line in path.read_text(errors="replace").splitlines():
                record = json.loads(line)
                at = datetime.datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()
                lines.append((at, str(record.get("event"))))
        return sorted(lines)


def measure(run: dict[str, Any], slots: int) -> dict[str, Any]:
    tasks = list(run["tasks"].values())
    makespan = run["end"] - run["start"]
    work = sum(t["ended"] - t["started"] for t in tasks)
    measured = {
        "makespan": makespan,
        "busy": work / (slots * makespan),
        "gap_fifo": statistics.median(gaps(run, slots, by_gpu=False)),
    }
    if tasks[0]["gpu"] is not None:
        measured["gap_gpu"] = statistics.median(gaps(run, slots, by_gpu=True))
    return measured


#: The steps from one task's function end to the next task's function start on the same GPU (slot): the mark that
#: ends each, and whose time it is. A mark is a key of the task's row (``ended``, ``released``, ``success``,
#: ``queued``, ``running``, ``started``: the function's own times, the lock's release, the metadata DB's), or the
#: first line of the task's log that starts with the given text.
STEPS: list[tuple[str, str, str]] = [
    ("the function ends → the GPU's lock is released", "released", "provider: the task process's end"),
    ("→ the profile is logged", "[gpu] profile:", "provider: the result read back"),
    ("→ `execute()` returns", "::group::Post Execute", "provider: the profile stored (XCom, state store)"),
    ("→ the task instance is `success` (pool slot free)", "success", "Airflow: XCom of the return value"),
    ("→ the next task is queued", "queued", "Airflow: the scheduler's loop"),
    ("→ it is `running`", "running", "Airflow: the executor, the task supervisor"),
    ("→ its `execute()` starts", "::endgroup::", "Airflow: the DAG file's parse (the provider's import)"),
    ("→ the task is prepared", "GPU task ", "provider: run-time imports, options, request"),
    ("→ its task process is started on a GPU", "Starting task process", "provider: orphans, GPU lock, folder"),
    ("→ the runtime is up", "[gpu] backend=", "provider: the supervisor's and the runtime's start"),
    ("→ its function starts", "started", "provider: the runtime's summary, profiler"),
]
#: the steps that are the provider's time alone (the DAG file's parse in the task process is Airflow's and the
#: provider's: compare it with the plain contender's)
PROVIDER_STEPS = {name for name, _, whose in STEPS if whose.startswith("provider")}
#: the marks of a task of one contender that belong to the task that ended (the rest are the next task's)
ENDING = ("ended", "released", "[gpu] profile:", "::group::Post Execute", "success")


def marks(bench: Bench, run: dict[str, Any], index: int, releases: list[float]) -> dict[str, float]:
    """A task's marks: its row's times, its GPU lock's release after its function ended, and the first log line of
    each mark before its function started (the next task's marks) or after it ended (the ending task's)."""
    task = run["tasks"][index]
    found = {key: task[key] for key in ("ended", "success", "queued", "running", "started") if task.get(key)}
    released = [at for at in releases if at >= task["ended"] - 0.02]
    if released:
        found["released"] = released[0]
    for at, event in bench.log_events(run["dag_id"], run["run_id"], index):
        for _, mark, _ in STEPS:
            ending = mark in ENDING
            if mark in found or mark.isidentifier() or not event.startswith(mark):
                continue
            if (ending and at >= task["ended"]) or (not ending and at <= task["started"] + 0.05):
                found[mark] = at
    return found


def hand_overs(run: dict[str, Any], slots: int, by_gpu: bool = True) -> list[tuple[int, int]]:
    """``(ended, next)`` pairs of map indexes: on the same GPU (``by_gpu``, where the tasks name theirs), else the
    k-th end with the (k + slots)-th start (a task takes the slot freed longest ago)."""
    tasks = run["tasks"]
    if by_gpu and next(iter(tasks.values()))["gpu"] is not None:
        pairs = []
        for gpu in {t["gpu"] for t in tasks.values()}:
            mine = sorted((i for i, t in tasks.items() if t["gpu"] == gpu), key=lambda i: tasks[i]["started"])
            pairs += list(itertools.pairwise(mine))
        return pairs
    ends = sorted(tasks, key=lambda i: tasks[i]["ended"])
    starts = sorted(tasks, key=lambda i: tasks[i]["started"])
    return list(zip(ends, starts[slots:], strict=False))


def gaps(run: dict[str, Any], slots: int, by_gpu: bool) -> list[float]:
    """The idle gaps of :func:`hand_overs`: from one task's function end to the next one's start."""
    tasks = run["tasks"]
    return [tasks[b]["started"] - tasks[a]["ended"] for a, b in hand_overs(run, slots, by_gpu)]


def breakdown(
    bench: Bench, run: dict[str, Any], slots: int, releases: dict[str, list[float]]
) -> list[dict[str, float]]:
    """For each hand-over, the seconds of each step of :data:`STEPS` that both tasks' marks bound (a step whose
    mark the contender lacks is merged into the next one)."""
    rows = []
    for done, following in hand_overs(run, slots):
        gpu = run["tasks"][done]["gpu"]
        before = marks(bench, run, done, releases.get(gpu, []) if gpu is not None else [])
        after = marks(bench, run, following, [])
        timeline = [("ended", before["ended"])]
        for name, mark, _ in STEPS:
            at = (before if mark in ENDING else after).get(mark)
            if at is not None:
                timeline.append((name, at))
        rows.append({name: at - previous for (_, previous), (name, at) in itertools.pairwise(timeline)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=32, help="mapped tasks per DAG run (32)")
    parser.add_argument("--seconds", type=float, default=1.5, help="how long each function sleeps (1.5)")
    parser.add_argument("--gpus", type=int, default=4, help="listed GPUs, and the plain pool's slots (4)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each contender, interleaved (3)")
    parser.add_argument("--parallelism", type=int, default=8, help="[core] parallelism (8)")
    parser.add_argument("--quick", action="store_true", help="12 tasks of 1 s, 2 rounds (under 3 minutes)")
    parser.add_argument("--keep", action="store_true", help="keep the Airflow home (its logs) for a look")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.seconds, args.rounds = 12, 1.0, 2
    # as an installed provider is: compiled (these machines set PYTHONDONTWRITEBYTECODE, and an editable install has
    # no .pyc files), so that each task process does not compile the provider's modules again
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "airflow_gpu_provider")], check=True)
    home = Path(tempfile.mkdtemp(prefix="airflow-gpu-bench-queue-"))
    prefix = f"queue_bench_{secrets.token_hex(3)}"
    (home / "dags").mkdir()
    for name, text in DAG_FILES.items():
        source = text.format(prefix=prefix, tasks=args.tasks, seconds=args.seconds, gpus=args.gpus)
        (home / "dags" / f"{name}_queue.py").write_text(source)
    os.environ["AIRFLOW__GPU__STATE_DIR"] = str(home / "gpu-state")
    from airflow_gpu_provider.host.allocator import GpuAllocator
    from airflow_gpu_provider.host.inventory import Device

    allocator = GpuAllocator(home / "gpu-state" / "locks")
    locks = {str(i): str(allocator.lock_path(Device(str(i)))) for i in range(args.gpus)}
    config = {
        "AIRFLOW__GPU__DEVICES": ",".join(map(str, range(args.gpus))),
        "AIRFLOW__GPU__POOL": "gpu",
        "AIRFLOW__GPU__INVENTORY": f"*={args.gpus}",
        "AIRFLOW__CORE__PARALLELISM": str(args.parallelism),
    }
    airflow = Airflow(home, home / "dags", config)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
    steps: dict[str, list[dict[str, float]]] = {name: [] for name in CONTENDERS}
    load = [os.getloadavg()[0]]
    watch = LockWatch(locks)
    try:
        airflow.start()
        airflow.run("pools", "set", "plain", str(args.gpus), "the plain contender's pool")
        parsed = lambda: len(airflow.query("SELECT 1 FROM serialized_dag WHERE dag_id LIKE ?", f"{prefix}%")) == 4  # noqa: E731
        airflow.wait(parsed, 240, "the DAGs to be parsed")
        bench = Bench(airflow, prefix)
        watch.start()
        timeout = 600 + 10 * args.tasks * args.seconds
        for name in CONTENDERS:
            bench.run_dag(f"{name}_warmup", timeout)
        for round_ in range(args.rounds):
            for name in CONTENDERS if round_ % 2 == 0 else CONTENDERS[::-1]:  # A B B A ...
                run = bench.run_dag(name, timeout)
                load.append(os.getloadavg()[0])
                results[name].append(measure(run, args.gpus))
                steps[name] += breakdown(bench, run, args.gpus, watch.releases)
                print(f"round {round_ + 1} {name}: {results[name][-1]}", file=sys.stderr)
    finally:
        watch.stop()
        left = airflow.stop()
        if args.keep:
            print(f"Kept {home}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)
    report(results, steps, args, load)
    print(f"\nCleaned up: {len(left)} process(es) left {left}, home {'kept' if args.keep else 'removed'}.")


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    """``median (min–max)``."""
    low, middle, high = (f"{v * scale:.{digits}f}" for v in (min(values), statistics.median(values), max(values)))
    return f"{middle} ({low}–{high})"


def report(
    results: dict[str, list[dict[str, Any]]], steps: dict[str, list[dict[str, float]]], args: Any, load: list[float]
) -> None:
    gpu, plain = results["gpu"], results["plain"]
    ratios = [g["makespan"] / p["makespan"] for g, p in zip(gpu, plain, strict=True)]
    added = [g["gap_fifo"] - p["gap_fifo"] for g, p in zip(gpu, plain, strict=True)]
    print(
        f"\n## A queue of {args.tasks} one-GPU tasks of {args.seconds:g} s over {args.gpus} GPUs vs plain `@task` in "
        f"a {args.gpus}-slot pool\n\nLocalExecutor, parallelism {args.parallelism}, {args.rounds} rounds (A B B A), "
        f"medians (min–max); {datetime.date.today()}, {os.cpu_count()} CPUs, load average {min(load):.1f}–"
        f"{max(load):.1f}.\n"
    )
    print("| contender | makespan s | busy share | idle gap s (slot pairing) | idle gap s (same GPU) |")
    print("| --- | --- | --- | --- | --- |")
    for name, rows in results.items():
        same_gpu = spread([r["gap_gpu"] for r in rows]) if "gap_gpu" in rows[0] else "–"
        print(
            f"| `{'@task.gpu(gpu_count=1)' if name == 'gpu' else '@task(pool=...)'}` "
            f"| {spread([r['makespan'] for r in rows])} | {spread([r['busy'] for r in rows], 100, 0)} % "
            f"| {spread([r['gap_fifo'] for r in rows])} | {same_gpu} |"
        )
    ratio, gap = statistics.median(ratios), statistics.median(added)
    own = [sum(v for k, v in row.items() if k in PROVIDER_STEPS) for row in steps["gpu"]]
    verdict = lambda met: "met" if met else "**not met**"  # noqa: E731
    print("\n| measure (each round: runs back to back) | result | goal | verdict |\n| --- | --- | --- | --- |")
    print(f"| makespan, gpu / plain | {spread(ratios, digits=3)}x | ≤ 1.1x | {verdict(ratio <= 1.1)} |")
    print(f"| idle gap, gpu − plain | {spread(added)} s | ≤ 0.2 s | {verdict(gap <= 0.2)} |")
    print(
        f"| the provider's own steps of a hand-over (their sum; the scheduler's loop, up to a second, is not in it) "
        f"| {spread(own, digits=3)} s | ≤ 0.2 s | {verdict(statistics.median(own) <= 0.2)} |"
    )
    counts = {name: len(rows) for name, rows in steps.items()}
    print(
        f"\nWhere the idle gap goes: medians of {counts['gpu']} (gpu) and {counts['plain']} (plain) hand-overs from "
        "one task's function end to the next task's function start on its GPU (slot); a step a contender lacks is part "
        "of its next one.\n"
    )
    print("| step | whose time | gpu s | plain s |\n| --- | --- | --- | --- |")
    for name, _, whose in STEPS:
        cells = []
        for contender in CONTENDERS:
            values = [row[name] for row in steps[contender] if name in row]
            cells.append(f"{statistics.median(values):.3f}" if values else "–")
        print(f"| {name} | {whose} | {' | '.join(cells)} |")
    totals = [f"{statistics.median([sum(row.values()) for row in steps[c]]):.3f}" for c in CONTENDERS]
    print(f"| **function end → next function start** | | {' | '.join(totals)} |")


if __name__ == "__main__":
    main()
