"""Deferred Slurm tasks are followed by one query per cluster and poll, however many wait: Airflow's shared stream.

Two triggers for two real jobs run in the triggerer's own ``SharedStreamManager`` (Airflow 3.3), as the triggerer
runs them; slurmctld's own RPC counters (``sdiag``) count the job queries it answered meanwhile.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from airflow_gpu_provider.backends.slurm import orphans
from airflow_gpu_provider.backends.slurm.trigger import SlurmJobTrigger

pytestmark = pytest.mark.usefixtures("airflow_home")
POLL = 0.5


def _job_queries(slurm) -> int:
    found = re.search(r"REQUEST_JOB_INFO\s+\(\s*\d+\)\s+count:(\d+)", slurm.run("sdiag"))
    return int(found.group(1)) if found else 0


async def _both(triggers: list[SlurmJobTrigger]) -> list[dict]:
    from airflow.triggers.shared_stream import SharedStreamManager

    manager = SharedStreamManager()

    async def one(number: int, trigger: SlurmJobTrigger) -> dict:
        stream = manager.subscribe(trigger_id=number, trigger=trigger, key=trigger.shared_stream_key())
        try:
            async for event in trigger.filter_shared_stream(stream):
                return event.payload
        finally:
            await manager.unsubscribe(number, trigger.shared_stream_key())
        raise AssertionError("no event")

    try:
        return list(await asyncio.gather(*(one(number, t) for number, t in enumerate(triggers))))
    finally:
        await manager.stop_all()


def test_two_deferred_jobs_share_one_query_per_poll(slurm):
    mark = orphans.comment({"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": "-1"}, durable=True)
    submit = ("sbatch", "--parsable", f"--chdir={slurm.shared}", f"--comment={mark}", "--wrap")  # the provider's jobs
    jobs = [slurm.run(*submit, f"sleep {n}").strip() for n in (2, 4)]
    triggers = [SlurmJobTrigger(job, {"slurm_conn_id": "slurm_test"}, POLL) for job in jobs]
    slurm.run("sdiag", "--reset")
    started = time.monotonic()
    events = asyncio.run(_both(triggers))
    polls = (time.monotonic() - started) / POLL
    queries = _job_queries(slurm)
    assert [(e["job_id"], e["status"], e["job_state"]) for e in events] == [(j, "ended", "COMPLETED") for j in jobs]
    assert queries <= polls + 2, (queries, polls)  # one per poll, for both jobs (two triggers polling alone: 2x)
