"""Deferrable GPU tasks on a real Airflow: the worker slot a long Docker GPU task holds, deferred vs not.

A real Airflow runs in a throw-away home (SQLite): API server, DAG processor, scheduler with the LocalExecutor
(parallelism 4) and a triggerer, with Airflow's default scheduler and triggerer settings, and one GPU listed by
``[gpu] devices = 0``. The task is ``GpuStepOperator(backend="docker", gpu_count=1)`` whose function sleeps
``--seconds`` (60 by default) in a container. This machine has no NVIDIA runtime, so the task says
``on_missing_gpu="cpu"``: the worker takes the GPU's lock from the host allocator, the GPU container's start fails
(a create, start and remove that a GPU host does not pay, the same for both contenders), and the container runs on
the CPU while the GPU lock stays held for its life, as on a GPU host.

What is measured: a sampler reads the LocalExecutor's worker processes every 20 ms (``_airflow.WorkerWatch``). A
worker process is one executor slot: while it supervises a task instance its title names it, and it forks one task
process (Airflow's task runner) per phase: ``execute``, and after a deferral ``execute_complete``.

1. **Slot-seconds**: the seconds the task instance's task processes were alive, summed over its phases (the goal's
   measure: the deferred task holds a slot for under 5 % of its run, its end-to-end time), of which the seconds in
   the operator (from the task log: between Airflow's "Pre Execute" and "Post Execute"); and the seconds a worker
   was busy with it (the slot as the executor counts it: the task process plus Airflow's supervisor before and
   after it, which may wait up to ``[workers] min_heartbeat_interval`` after the process has exited).
2. **End to end**: from the task's first task process's start to its last one's end. Goal: deferred <= 1.1x the
   synchronous one + ``[gpu] poll_interval``.
3. **GPU free -> the waiting task runs**: while a deferred holder (the same task) runs, a local task with
   ``on_missing_gpu="wait"`` and ``deferrable=True`` needing the one GPU is deferred to ``GpuFreeTrigger``. The
   sampler also reads the GPU's lock in ``/proc/locks``; from its release, the times until the trigger fires (the
   triggerer's log), a worker takes the task again, the task instance is ``running`` (the API server's log) and its
   function starts on the GPU (its return value). Goal: < 2 s. And what the waiting task held on a worker while
   the GPU was busy: its task processes and its slot until the lock's release (goal: nothing, the task started from
   the triggerer with Airflow 3.3's ``start_from_trigger``; a task that starts on a worker and defers holds one for
   its first phase).

A warm-up run of each DAG comes first (the API server's, the triggerer's and the engine's first calls are slow).
The contenders then run one after the other, ``--rounds`` times; medians are printed. A round whose deferred
container was removed by another user of the Docker engine (a shared machine) is run again, and said so. Everything
started is removed at the end, on every path: the Airflow processes (and any process left with this home in its
environment, such as a GPU-lock keeper), the containers of the benchmark's DAGs, the home folder.

    python benchmarks/deferral.py [--seconds 60] [--rounds 3] [--base-image airflow-gpu-base:bookworm]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

from _airflow import Airflow, WorkerWatch

DAGS = """
import datetime

from airflow.sdk import DAG

from airflow_gpu_provider import GpuStepOperator, ImageSettings, gpu_task

START = datetime.datetime(2024, 1, 1)


def sleeps(seconds: float) -> dict:
    import time

    started = time.time()
    print("sleeping", seconds, "s", flush=True)
    time.sleep(seconds)
    return {{"started": started, "ended": time.time()}}


for _name, _deferrable, _seconds in (("sync", False, {seconds}), ("deferred", True, {seconds}), ("warmup", True, 10)):
    with DAG(f"{prefix}_{{_name}}", schedule=None, start_date=START, catchup=False):
        GpuStepOperator(
            task_id="gpu_task",
            python_callable=sleeps,
            op_args=[_seconds],
            backend="docker",
            image=ImageSettings(parent_image={image!r}),
            gpu_count=1,
            on_missing_gpu="cpu",
            deferrable=_deferrable,
        )

with DAG("{prefix}_waiter", schedule=None, start_date=START, catchup=False):

    @gpu_task(gpu_count=1, on_missing_gpu="wait", deferrable=True, wait_timeout=3600)
    def waits_for_the_gpu() -> float:
        import time

        return time.time()

    waits_for_the_gpu()
"""


#: what a deferred Docker task's log says when its container was removed behind its back (its resume, or the
#: engine's answer to it)
REAPED = ("was removed while the task was deferred", "No such container")


class Reaped(RuntimeError):
    """A deferred task's container was removed by another user of the Docker engine.

    On a machine shared with other Airflow deployments (or test sessions), a Docker task of another deployment removes
    the containers of workers that have exited, asking its own Airflow whether their task instance has ended: a
    provider version that counts a task instance its Airflow does not know as ended removes a deferred container.
    The round is run again (and the retries are reported).
    """


class Bench:
    """The benchmark's DAGs on the Airflow, the sampler, the GPU's lock."""

    def __init__(self, airflow: Airflow, prefix: str, lock_file: Path) -> None:
        self.airflow, self.prefix, self.lock_file = airflow, prefix, lock_file
        self.watch = WorkerWatch(airflow.scheduler_pid, probe=self.lock_held)
        self.runs = 0

    def lock_held(self) -> bool:
        from airflow_gpu_provider.host.waiting import free_count

        return free_count([str(self.lock_file)]) == 0

    def trigger(self, name: str) -> str:
        self.runs += 1
        run_id = f"bench_{self.runs}"
        self.airflow.run("dags", "trigger", f"{self.prefix}_{name}", "--run-id", run_id)
        return run_id

    def finished(self, name: str, run_id: str, timeout: float) -> tuple[str, Any]:
        """Wait for the run to end; its task instance's id and return value. The task must succeed."""
        dag_id = f"{self.prefix}_{name}"

        def state() -> str | None:
            rows = self.airflow.query("SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", dag_id, run_id)
            return rows[0][0] if rows and rows[0][0] in ("success", "failed") else None

        if self.airflow.wait(state, timeout, f"{dag_id} {run_id}") != "success":
            logs = self.airflow.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
            text = "".join(path.read_text(errors="replace") for path in logs.glob("task_id=*/*.log"))
            if any(sign in text for sign in REAPED):
                raise Reaped(f"{dag_id} {run_id}: its container was removed by someone else while it was deferred")
            raise RuntimeError(f"{dag_id} {run_id} failed:\n{self.airflow.logs()}")
        ((ti_id,),) = self.airflow.query("SELECT id FROM task_instance WHERE dag_id = ? AND run_id = ?", dag_id, run_id)
        rows = self.airflow.query(
            "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND key = 'return_value'", dag_id, run_id
        )
        value = rows[0][0] if rows else None
        while isinstance(value, (str, bytes)):  # JSON, perhaps of a JSON string
            value = json.loads(value)
        ended = lambda: ti_id in self.watch.slots and all(s.end for s in self.watch.slots[ti_id])  # noqa: E731
        self.airflow.wait(ended, 60, f"the worker to end {dag_id} {run_id}", interval=0.1)  # it outlives the run
        return ti_id, value

    def log(self, name: str, run_id: str, pattern: str) -> list[tuple[float, str]]:
        """``(time, event)`` of a run's task log (``pattern``: ``attempt=1.log``) or trigger log lines."""
        folder = self.airflow.home / "logs" / f"dag_id={self.prefix}_{name}" / f"run_id={run_id}"
        lines = []
        for path in folder.glob(f"task_id=*/{pattern}"):
            for line in path.read_text().splitlines():
                record = json.loads(line)
                stamp = datetime.datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00"))
                lines.append((stamp.timestamp(), str(record.get("event"))))
        return sorted(lines)

    def trigger_fired(self, name: str, run_id: str) -> float:
        """When the task instance's trigger fired (the triggerer's log line)."""
        fired = [at for at, event in self.log(name, run_id, "*.trigger.*.log") if event == "Trigger fired event"]
        if not fired:
            raise RuntimeError(f"no trigger fired for {name} {run_id}")
        return fired[0]

    def running_again(self, ti_id: str) -> float:
        """When the task instance's last phase started running (the API server's "Task started" log line)."""
        dashed = str(uuid.UUID(ti_id))
        started = []
        for line in (self.airflow.home / "api-server.log").read_text(errors="replace").splitlines():
            if "Task started" in line and f"ti_id={dashed}" in line:
                stamp = line.split()[0].replace("Z", "+00:00")
                started.append(datetime.datetime.fromisoformat(stamp).timestamp())
        if len(started) not in (1, 2):  # once when it started from the triggerer, else twice
            raise RuntimeError(f"task instance {dashed} started {len(started)} time(s)")
        return started[-1]

    def in_operator(self, name: str, run_id: str) -> dict[str, Any]:
        """From the task log, per phase: the seconds in the operator (``execute`` or ``execute_complete``: from the
        end of Airflow's "Pre Execute" to its "Post Execute"), and the seconds of the GPU container's failed start
        (this machine has no NVIDIA runtime: from the GPU's allocation to the engine's refusal)."""
        lines = self.log(name, run_id, "attempt=1.log")
        starts = [i for i, (_, event) in enumerate(lines) if event == "::group::Pre Execute"]
        operator, refused = [], 0.0
        for first, end in zip(starts, [*starts[1:], len(lines)], strict=True):
            phase = lines[first:end]
            begun = next(at for at, event in phase[1:] if event == "::endgroup::")
            ended = next(at for at, event in phase if event == "::group::Post Execute")
            operator.append(ended - begun)
            allocated = [at for at, event in phase if "from the host allocator" in event]
            refusal = [at for at, event in phase if "cannot start GPU containers" in event]
            refused += refusal[0] - allocated[0] if allocated and refusal else 0.0
        return {"operator_s": sum(operator), "phase_operator_s": [round(s, 2) for s in operator], "refused_s": refused}

    def held(self, ti_id: str) -> dict[str, Any]:
        """What a task instance held on workers: its task runners' lifetimes and its slots, per phase; its end to end
        time (from its first task runner's start to its last one's end)."""
        slots, runners = self.watch.slots.get(ti_id, []), self.watch.runners.get(ti_id, [])
        if not runners or len(runners) != len(slots):
            raise RuntimeError(f"task instance {ti_id}: {len(slots)} slot(s) but {len(runners)} task runner(s) seen")
        for slot, runner in zip(slots, runners, strict=True):  # the sampler may see a busy worker late
            slot.start = min(slot.start, runner.start)
        return {
            "phases": len(runners),
            "runner_s": sum(runner.seconds for runner in runners),
            "phase_runner_s": [round(runner.seconds, 2) for runner in runners],
            "slot_s": sum(slot.seconds for slot in slots),
            "phase_slot_s": [round(slot.seconds, 2) for slot in slots],
            "end_to_end_s": max(r.start + r.seconds for r in runners) - min(r.start for r in runners),
            "slot_starts": [slot.start for slot in slots],
        }


def run_task(bench: Bench, name: str, seconds: float) -> dict[str, Any]:
    """One run of the Docker GPU task (``sync`` or ``deferred``); what its task instance held."""
    run_id = bench.trigger(name)
    ti_id, value = bench.finished(name, run_id, seconds + 600)
    held = bench.held(ti_id)
    if held["phases"] != (2 if name == "deferred" else 1):
        raise RuntimeError(f"{name}: {held['phases']} phase(s) on a worker")
    return {**held, **bench.in_operator(name, run_id), "function_s": value["ended"] - value["started"]}


def gpu_free_to_running(bench: Bench, seconds: float) -> dict[str, float]:
    """A deferred holder takes the GPU, a waiting task waits deferred; what the waiting task held on a worker until
    the GPU was free, and the times from the lock's release to the waiting task running."""
    holder_run = bench.trigger("deferred")
    bench.airflow.wait(bench.lock_held, 300, "the holder taking the GPU lock", interval=0.1)
    asked = time.time()
    waiter_run = bench.trigger("waiter")
    waiter_id, function_started = bench.finished("waiter", waiter_run, seconds + 600)
    bench.finished("deferred", holder_run, 600)
    held = bench.held(waiter_id)
    starts = held["slot_starts"]
    samples = bench.watch.samples
    released = [at for (at, now), (_, before) in zip(samples[1:], samples, strict=False) if before and not now]
    # the GPU freed while the waiting task waited: before the slot that ran its function, after any that deferred it
    freed = [at for at in released if asked < at < starts[-1] and all(s < at for s in starts[:-1])]
    if not freed:
        raise RuntimeError(
            f"the waiting task ran in {len(starts)} phase(s) and never waited: give the holder more --seconds"
        )
    waiting = lambda spans: sum(max(0.0, min(s.end, freed[0]) - s.start) for s in spans)  # noqa: E731
    return {
        "phases": held["phases"],
        "waiting_runner_s": waiting(bench.watch.runners[waiter_id]),
        "waiting_slot_s": waiting(bench.watch.slots[waiter_id]),
        "to_trigger_s": bench.trigger_fired("waiter", waiter_run) - freed[0],
        "to_slot_s": starts[-1] - freed[0],
        "to_running_s": bench.running_again(waiter_id) - freed[0],
        "to_function_s": function_started - freed[0],
    }


def retried(measure: Any, retries: list[str], tries: int = 5) -> Any:
    """``measure()``, run again when another user of the engine removed its container (:class:`Reaped`)."""
    for _ in range(tries - 1):
        try:
            return measure()
        except Reaped as err:
            retries.append(str(err))
            print(f"run again: {err}", file=sys.stderr)
    return measure()


def remove_containers(prefix: str) -> int:
    """Remove the containers of the benchmark's DAGs (none expected: each task removes its own)."""
    import docker

    label = "airflow-gpu-provider.dag_id"
    client = docker.APIClient()
    try:
        found = [
            container["Id"]
            for container in client.containers(all=True, filters={"label": label})
            if container["Labels"][label].startswith(prefix)
        ]
        for container_id in found:
            client.remove_container(container_id, force=True)
        return len(found)
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the task's function sleeps (60)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each contender (3)")
    parser.add_argument(
        "--base-image", default=os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm")
    )
    args = parser.parse_args()
    if args.seconds < 20:
        parser.error("--seconds must be at least 20: the waiting task must defer while the holder runs")
    home = Path(tempfile.mkdtemp(prefix="airflow-gpu-bench-deferral-"))
    prefix = f"deferral_bench_{secrets.token_hex(3)}"
    (home / "dags").mkdir()
    (home / "dags" / "bench_dags.py").write_text(
        DAGS.format(prefix=prefix, seconds=args.seconds, image=args.base_image)
    )
    os.environ["AIRFLOW__GPU__STATE_DIR"] = str(home / "gpu-state")  # the cluster's, for GpuConfig below
    from airflow_gpu_provider.config.worker import GpuConfig
    from airflow_gpu_provider.host.allocator import GpuAllocator
    from airflow_gpu_provider.host.inventory import Device

    lock_file = GpuAllocator(home / "gpu-state" / "locks").lock_path(Device("0"))
    airflow = Airflow(home, home / "dags", {"AIRFLOW__GPU__DEVICES": "0", "AIRFLOW__CORE__PARALLELISM": "4"})
    results: dict[str, list[dict[str, Any]]] = {"sync": [], "deferred": [], "wait": []}
    retries: list[str] = []
    try:
        airflow.start()
        parsed = lambda: len(airflow.query("SELECT 1 FROM serialized_dag WHERE dag_id LIKE ?", f"{prefix}%")) == 4  # noqa: E731
        airflow.wait(parsed, 180, "the DAGs to be parsed")
        bench = Bench(airflow, prefix, lock_file)
        bench.watch.start()
        try:
            for name in ("warmup", "waiter"):
                retried(lambda name=name: bench.finished(name, bench.trigger(name), 600), retries)
            for round_ in range(1, args.rounds + 1):
                for name in ("sync", "deferred", "wait"):
                    measure = (
                        partial(gpu_free_to_running, bench, args.seconds)
                        if name == "wait"
                        else partial(run_task, bench, name, args.seconds)
                    )
                    results[name].append(retried(measure, retries))
                    print(f"round {round_} {name}: {results[name][-1]}", file=sys.stderr)
        finally:
            bench.watch.stop()
    finally:
        left = airflow.stop()
        containers = remove_containers(prefix)
        shutil.rmtree(home, ignore_errors=True)
    report(results, args, GpuConfig.read().poll_interval)
    for retry in retries:
        print(f"\nRun again: {retry}.")
    print(
        f"\nCleaned up: {containers} container(s) left by the tasks, {len(left)} process(es) left {left}, home removed."
    )


def report(results: dict[str, list[dict[str, Any]]], args: Any, poll: float) -> None:
    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    def phases(name: str, key: str) -> str:  # the phases of the median round
        ordered = sorted(results[name], key=lambda r: r[key.replace("phase_", "")])
        return " + ".join(f"{s:.2f}" for s in ordered[len(ordered) // 2][key])

    print(
        f"\n## A {args.seconds:.0f} s Docker GPU task on a LocalExecutor worker, deferred vs not "
        f"({args.rounds} round(s), medians; seconds per phase in brackets)\n"
    )
    print(
        "| contender | phases | task process alive | of which in the operator | worker slot busy | share of the run "
        "(process / slot) | end to end |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in ("sync", "deferred"):
        e2e = median(name, "end_to_end_s")
        print(
            f"| `deferrable={name == 'deferred'}` | {median(name, 'phases'):.0f} "
            f"| {median(name, 'runner_s'):.2f} s ({phases(name, 'phase_runner_s')}) "
            f"| {median(name, 'operator_s'):.2f} s ({phases(name, 'phase_operator_s')}) "
            f"| {median(name, 'slot_s'):.2f} s ({phases(name, 'phase_slot_s')}) "
            f"| {median(name, 'runner_s') / e2e:.1%} / {median(name, 'slot_s') / e2e:.1%} | {e2e:.2f} s |"
        )
    sync_e2e, deferred_e2e = median("sync", "end_to_end_s"), median("deferred", "end_to_end_s")
    process, slot = median("deferred", "runner_s") / deferred_e2e, median("deferred", "slot_s") / deferred_e2e
    on_gpu_host = (median("deferred", "runner_s") - median("deferred", "refused_s")) / deferred_e2e
    allowed = 1.1 * sync_e2e + poll
    fired, taken, running, function = (
        median("wait", key) for key in ("to_trigger_s", "to_slot_s", "to_running_s", "to_function_s")
    )
    verdict = lambda met: "met" if met else "**not met**"  # noqa: E731
    print("\n| measure | result | goal | verdict |\n| --- | --- | --- | --- |")
    print(f"| deferred task: its process alive, share of its run | {process:.1%} | < 5 % | {verdict(process < 0.05)} |")
    print(
        f"| the same, less the GPU container's refused start ({median('deferred', 'refused_s'):.2f} s: no NVIDIA "
        f"runtime here) | {on_gpu_host:.1%} | < 5 % | {verdict(on_gpu_host < 0.05)} |"
    )
    print(f"| deferred task: a worker slot busy, share of its run | {slot:.1%} | < 5 % | {verdict(slot < 0.05)} |")
    print(
        f"| end to end, deferred / not | {deferred_e2e:.2f} s / {sync_e2e:.2f} s = {deferred_e2e / sync_e2e:.3f}x "
        f"| <= 1.1x + {poll:g} s poll = {allowed:.2f} s | {verdict(deferred_e2e <= allowed)} |"
    )
    print(
        f"| GPU free -> the waiting task is running | the trigger fires {fired:.2f} s, a worker takes the task "
        f"{taken:.2f} s, it is `running` {running:.2f} s | < 2 s | {verdict(running < 2)} |"
    )
    print(
        f"| GPU free -> the waiting task's function starts on the GPU | {function:.2f} s | < 2 s "
        f"| {verdict(function < 2)} |"
    )
    waiting_slot, waiting_runner = median("wait", "waiting_slot_s"), median("wait", "waiting_runner_s")
    print(
        f"| the waiting task while its GPU was busy: worker phases, task process alive, worker slot busy "
        f"| {median('wait', 'phases'):.0f} phase(s) in all; {waiting_runner:.2f} s; {waiting_slot:.2f} s "
        f"| 0 s (started from the triggerer) | {verdict(waiting_slot == 0)} |"
    )


if __name__ == "__main__":
    main()
