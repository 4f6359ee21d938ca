"""Shares of one GPU in the host allocator (``host/shares.py``): real flocks, real processes, real SIGKILLs.

Never more promised than a GPU has, whole GPUs and shares never mixed (properties, with Hypothesis, and with
processes racing), shares gathered on the fullest GPU, a killed holder's share freed by the kernel, a share held
on by the task process after the worker let go, the wait of a share (seen from outside, as the trigger sees it).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpu_provider.exceptions import GpuUnavailableError
from airflow_gpu_provider.host import shares
from airflow_gpu_provider.host.allocator import GpuAllocator
from airflow_gpu_provider.host.inventory import Device, parse_devices
from airflow_gpu_provider.host.locks import held_now, kinds
from airflow_gpu_provider.host.waiting import MustWait, ready
from airflow_gpu_provider.settings.shares import SHARE_PARTS, GpuShare

GIB = 2**30
L4, T4 = parse_devices("0=L4,1=T4")  # 24 GiB and 16 GiB
log = logging.getLogger("test")


def _acquire(allocator: GpuAllocator, share: GpuShare | None, devices=(L4, T4), **kwargs):
    options = {"policy": "fail", "holder": "dag.t run r (local)", "requested": "a share", "log": log, **kwargs}
    return allocator.acquire(list(devices), 1, present=list(devices), share=share, **options)


def _promised(allocator: GpuAllocator, device: Device) -> int:
    return SHARE_PARTS - shares.free_parts(allocator.lock_path(device))


def test_shares_gather_on_the_fullest_gpu_and_never_mix_with_a_whole_gpu(tmp_path):
    allocator = GpuAllocator(tmp_path / "locks")
    first = _acquire(allocator, GpuShare(memory=8 * GIB))
    second = _acquire(allocator, GpuShare(memory=8 * GIB))
    assert first.devices == second.devices == [T4]  # the T4 holds both exactly: the L4 stays whole
    assert _promised(allocator, T4) == SHARE_PARTS
    assert allocator.holder_of(T4).startswith("2 share(s): dag.t run r (local) (pid ")
    third = _acquire(allocator, GpuShare(fraction=0.5))
    assert third.devices == [L4]
    with pytest.raises(GpuUnavailableError, match=r"free: none, busy: 0 held by 1 share\(s\)"):
        _acquire(allocator, None)  # a whole GPU never lands on a GPU with shares
    third.release()
    whole = _acquire(allocator, None)
    assert whole.devices == [L4]
    with pytest.raises(GpuUnavailableError, match=r"unpromised: 0 0 %, 1 0 %"):
        _acquire(allocator, GpuShare(fraction=0.1))  # nor a share on a GPU a whole task holds
    for allocation in (first, second, whole):
        allocation.release()
    assert [_promised(allocator, d) for d in (L4, T4)] == [0, 0]
    assert not list((tmp_path / "locks").glob("*.share-*"))  # released shares leave no file


def test_a_share_no_gpu_can_hold_says_why_and_a_wait_is_deferred_with_what_it_needs(tmp_path):
    allocator = GpuAllocator(tmp_path / "locks")
    with pytest.raises(GpuUnavailableError, match="No GPU of this host can hold the share"):
        _acquire(allocator, GpuShare(memory=30 * GIB), policy="wait")  # waiting cannot help
    unknown = [Device("0")]  # [gpu] devices without a model: its memory is unknown
    with pytest.raises(GpuUnavailableError, match="their memory is unknown"):
        _acquire(allocator, GpuShare(memory=GIB), devices=unknown)
    with _acquire(allocator, GpuShare(fraction=0.5), devices=unknown) as fraction:
        assert fraction.devices == unknown  # a fraction needs no size
    held = _acquire(allocator, GpuShare(fraction=0.5))
    assert held.devices == [L4]
    with pytest.raises(MustWait) as wait:
        _acquire(allocator, GpuShare(memory=20 * GIB), policy="wait", defer=True)
    assert wait.value.parts == [8334] and wait.value.count == 1  # what it needs of the L4; the T4 never holds it
    assert ready(wait.value.lock_files, 1, wait.value.parts) == (False, 0)  # as the trigger sees it: no lock taken
    held.release()
    assert ready(wait.value.lock_files, 1, wait.value.parts) == (True, 1)


def test_the_first_share_starts_and_the_last_stops_what_the_gpu_needs(tmp_path):
    calls: list[str] = []

    def daemon(device: Device) -> shares.GpuDaemon:
        return shares.GpuDaemon(lambda: calls.append(f"start {device.id}"), lambda: calls.append(f"stop {device.id}"))

    allocator = GpuAllocator(tmp_path / "locks")
    a = _acquire(allocator, GpuShare(fraction=0.5), devices=[L4], daemon=daemon)
    b = _acquire(allocator, GpuShare(fraction=0.5), devices=[L4], daemon=daemon)
    a.release()
    assert calls == ["start 0"]
    b.release()
    b.release()  # idempotent
    assert calls == ["start 0", "stop 0"]


_HOLDER = """
import logging, sys, time
from airflow_gpu_provider.host.allocator import GpuAllocator
from airflow_gpu_provider.host.inventory import parse_devices
from airflow_gpu_provider.settings.shares import GpuShare
devices = parse_devices("0=L4")
allocation = GpuAllocator(sys.argv[1]).acquire(
    devices, 1, policy="fail", holder="victim", requested="a share", present=devices, log=logging.getLogger(),
    share=GpuShare(fraction=0.75))
print("held", allocation.devices[0].id, flush=True)
time.sleep(600)
"""


def test_a_sigkilled_holder_frees_its_share_by_itself(tmp_path):
    allocator = GpuAllocator(tmp_path / "locks")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path / "locks")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().split() == ["held", "0"]
        assert _promised(allocator, L4) == 7500
        assert "victim" in (allocator.holder_of(L4) or "")
        with pytest.raises(GpuUnavailableError):
            _acquire(allocator, GpuShare(fraction=0.5), devices=[L4])
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert _promised(allocator, L4) == 0  # the kernel dropped its flocks: nothing to repair
    assert len(list((tmp_path / "locks").glob("*.share-*"))) == 1  # its file, which promises nothing now
    _acquire(allocator, GpuShare(fraction=0.5), devices=[L4]).release()  # the next placement removes it
    assert not list((tmp_path / "locks").glob("*.share-*"))
    _acquire(allocator, None, devices=[L4]).release()


def test_a_share_stays_held_while_the_task_process_lives_after_the_worker_let_go(tmp_path):
    """As the local backend's child (or a container's keeper) inherits the descriptors."""
    allocator = GpuAllocator(tmp_path / "locks")
    allocation = _acquire(allocator, GpuShare(fraction=0.5), devices=[L4])
    child = subprocess.Popen(["sleep", "600"], pass_fds=allocation.fds)
    try:
        allocation.release()
        assert _promised(allocator, L4) == 5000  # still the child's
        with pytest.raises(GpuUnavailableError):
            _acquire(allocator, None, devices=[L4])
    finally:
        child.kill()
        child.wait()
    assert _promised(allocator, L4) == 0


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("share"), st.sampled_from([0.1, 0.25, 0.3333, 0.5, 0.75])),
            st.tuples(st.just("memory"), st.sampled_from([1, 4, 8, 12, 20])),
            st.tuples(st.just("whole"), st.just(0)),
            st.tuples(st.just("release"), st.integers(0, 10)),
        ),
        max_size=25,
    )
)
def test_never_more_promised_than_a_gpu_has_and_never_whole_and_shares_together(steps):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        allocator = GpuAllocator(Path(folder) / "locks")
        held: list = []
        for kind, size in steps:
            if kind == "release":
                if held:
                    held.pop(size % len(held)).release()
                continue
            share = GpuShare(fraction=size) if kind == "share" else GpuShare(memory=size * GIB) if size else None
            try:
                held.append(_acquire(allocator, share))
            except GpuUnavailableError:
                # refused only when no GPU could take it now
                assert all(_room(allocator, device, share) is False for device in (L4, T4))
            for device in (L4, T4):
                mine = [a for a in held if a.devices == [device]]
                wholes = [a for a in mine if a.share is None]
                parts = sum(a.share.claim.parts for a in mine if a.share is not None)
                assert parts <= SHARE_PARTS
                assert not (wholes and parts) and len(wholes) <= 1
                assert _promised(allocator, device) == (SHARE_PARTS if wholes else parts)
        for allocation in held:
            allocation.release()


def _room(allocator: GpuAllocator, device: Device, share: GpuShare | None) -> bool:
    """Whether ``device`` could take ``share`` (a whole GPU: ``None``) now, seen from outside."""
    lock = allocator.lock_path(device)
    if share is None:
        return not kinds(lock, held_now())
    need = share.parts_on(device.memory_total)
    return need is not None and shares.free_parts(lock) >= need


def _racer(lock_dir: str, record: str, seed: int, rounds: int) -> None:
    rng = random.Random(seed)
    allocator = GpuAllocator(lock_dir, poll_interval=0.005)
    for _ in range(rounds):
        share = rng.choice([None, GpuShare(fraction=0.25), GpuShare(fraction=0.5), GpuShare(memory=6 * GIB)])
        with _acquire(allocator, share, policy="wait") as allocation:
            start = time.monotonic()
            time.sleep(rng.uniform(0.001, 0.01))
            end = time.monotonic()
        parts = SHARE_PARTS if allocation.share is None else allocation.share.claim.parts
        line = json.dumps({"gpu": allocation.devices[0].id, "parts": parts, "start": start, "end": end})
        with open(record, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def test_processes_racing_for_shares_and_whole_gpus_never_overcommit_a_gpu(tmp_path):
    record = tmp_path / "held.jsonl"
    context = multiprocessing.get_context("fork")
    racers = [
        context.Process(target=_racer, args=(str(tmp_path / "locks"), str(record), seed, 15)) for seed in range(8)
    ]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(120)
        assert racer.exitcode == 0
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(rows) == 8 * 15
    for gpu in ("0", "1"):
        spans = [r for r in rows if r["gpu"] == gpu]
        for span in spans:  # at each start, what the GPU had promised: never more than it has
            at = span["start"]
            assert sum(r["parts"] for r in spans if r["start"] <= at < r["end"]) <= SHARE_PARTS, textwrap.shorten(
                str(span), 200
            )


def test_a_planted_share_file_is_refused(tmp_path):
    """The lock folder is private (host/state.py); a share file that is a symlink is never followed."""
    allocator = GpuAllocator(tmp_path / "locks")
    _acquire(allocator, None, devices=[L4]).release()
    target = tmp_path / "elsewhere"
    target.write_text(json.dumps({"parts": 1}))
    os.symlink(target, tmp_path / "locks" / "nvidia-0.share-planted")
    with pytest.raises(Exception, match="symlink"):
        _acquire(allocator, GpuShare(fraction=0.5), devices=[L4])


def test_the_trigger_of_a_deferred_share_fires_when_one_gpu_holds_it(tmp_path):
    """GpuFreeTrigger with ``parts``: as the triggerer runs it, reading /proc/locks only."""
    import asyncio

    from airflow_gpu_provider.host.trigger import GpuFreeTrigger

    allocator = GpuAllocator(tmp_path / "locks")
    held = _acquire(allocator, GpuShare(fraction=0.75), devices=[L4])
    with pytest.raises(MustWait) as wait:
        _acquire(allocator, GpuShare(fraction=0.5), devices=[L4], policy="wait", defer=True)
    trigger = GpuFreeTrigger(wait.value.lock_files, 1, time.time() + 30, poll_interval=0.05, parts=wait.value.parts)
    _, kwargs = trigger.serialize()
    assert kwargs["parts"] == [5000]
    rebuilt = GpuFreeTrigger(**kwargs)

    async def first_event() -> dict:
        events = rebuilt.run()
        task = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(0.3)
        assert not task.done()  # the L4 has a quarter unpromised: not enough
        held.release()
        return (await asyncio.wait_for(task, 10)).payload

    assert asyncio.run(first_event())["status"] == "free"
