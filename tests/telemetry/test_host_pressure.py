"""The host's CPU pressure in a profile (runtime/telemetry/pressure.py) and what the advice makes of it.

Real readings: this host's ``/proc/pressure/cpu``, ``/proc/loadavg`` and mount table, a real task process sampled
while other processes (started here, as a busy neighbour would) keep every CPU of the host busy.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shipped_runtime import run_runtime, shipped

from airflow_gpu_provider.telemetry.advice import HOST_BUSY_PCT, advice
from airflow_gpu_provider.telemetry.profile import Profile

pressure = shipped("telemetry.pressure")  # from the runtime's archive, as the task process imports it
PSI = Path("/proc/pressure/cpu")
needs_psi = pytest.mark.skipif(not PSI.exists(), reason="this kernel has no PSI (/proc/pressure/cpu)")
# The format the kernel documents (Documentation/accounting/psi.rst); the system-wide "full" line of the CPU file
# is all zeros since 5.13, and absent before.
DOCUMENTED = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


@contextlib.contextmanager
def busy_neighbours() -> Iterator[int]:
    """Two busy processes per CPU of the host, for as long as the block lasts: runnable work always waits."""
    count = 2 * (os.cpu_count() or 1)
    burn = "while True: pass"
    procs = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(count)]
    try:
        time.sleep(1.0)  # let them be scheduled
        yield count
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def run_sampled(tmp_path: Path, body: str) -> dict[str, Any]:
    """Run a function in a real runtime process with profiling on (every 0.2 s, no GPU); return its result."""
    source = "def task():\n" + textwrap.indent(textwrap.dedent(body), "    ")
    envelope = {"version": 2, "mode": "callable", "function": "task", "source": source, "summary": {"gpus": []}}
    (tmp_path / "envelope.json").write_text(json.dumps({**envelope, "profile": {"interval_s": 0.2}}))
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run_runtime(str(tmp_path / "envelope.json"), str(tmp_path / "result.json"), env=environment, timeout=120)
    return json.loads((tmp_path / "result.json").read_text())


def test_psi_lines_parse_as_the_kernel_documents_them():
    assert pressure.parse_psi(DOCUMENTED)["some"] == {"avg10": 0.0, "avg60": 0.0, "avg300": 0.0, "total": 0.0}
    older = "some avg10=12.50 avg60=3.25 avg300=0.75 total=98765432\n"  # before 5.13: no "full" line for CPUs
    assert pressure.parse_psi(older) == {"some": {"avg10": 12.5, "avg60": 3.25, "avg300": 0.75, "total": 98765432.0}}
    for bad in ("", "cpu 1 2 3", "some avg10=x avg60=0 avg300=0 total=1", "some avg10=1 avg60=0 avg300=0"):
        with pytest.raises(ValueError):
            pressure.parse_psi(bad)


@needs_psi
def test_this_hosts_psi_file_parses_and_its_total_grows():
    first = pressure.parse_psi(PSI.read_text())
    assert set(first) <= {"some", "full"} and 0 <= first["some"]["avg10"] <= 100
    time.sleep(0.2)
    assert pressure.parse_psi(PSI.read_text())["some"]["total"] >= first["some"]["total"]


def test_this_hosts_load_average_parses():
    one, five, fifteen = pressure.parse_loadavg(Path("/proc/loadavg").read_text())
    assert min(one, five, fifteen) >= 0


def test_the_scope_is_the_host_unless_the_file_is_a_mount_of_its_own(tmp_path):
    assert pressure.scope("/proc/pressure/cpu") == "host"  # this machine's real mount table
    assert pressure.scope("/proc/loadavg") == "host"
    lxcfs = tmp_path / "mountinfo"  # a container with LXCFS: its own views over the host's /proc files
    lxcfs.write_text(
        "715 705 0:62 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
        "734 715 0:58 /proc/loadavg /proc/loadavg rw,nosuid,nodev,relatime master:290 - fuse.lxcfs lxcfs "
        "rw,user_id=0,group_id=0,allow_other\n"
    )
    assert pressure.scope("/proc/loadavg", str(lxcfs)) == "container (fuse.lxcfs)"
    assert pressure.scope("/proc/pressure/cpu", str(lxcfs)) == "host"


@needs_psi
def test_a_task_starved_by_busy_neighbours_is_told_the_host_was_busy(tmp_path):
    """A task that wants one CPU, sampled while twice as many busy processes as CPUs run: its CPU share is low,
    the host's PSI says why, and the advice says so instead of blaming the task's input pipeline."""
    body = """
        import time
        end = time.monotonic() + 3
        while time.monotonic() < end:
            sum(range(2000))
            time.sleep(0.004)  # mostly waiting, like a task whose data arrives late
        return "done"
    """
    with busy_neighbours():
        result = run_sampled(tmp_path, body)
    value = {**result["profile"], "task": {}, "requested": {}}
    host_cpu = value["host_cpu"]
    assert host_cpu["source"] == "/proc/pressure/cpu" and host_cpu["scope"] == "host"
    assert host_cpu["pressure_pct"] >= HOST_BUSY_PCT and host_cpu["peak_avg10"] > 0, host_cpu
    profile = Profile.read(value)
    assert profile is not None and profile.host_cpu is not None
    mean = profile.devices[0].mean_util
    assert mean is not None and mean < 40, value["series"]
    expected = f"the host was busy (CPU pressure {host_cpu['pressure_pct']:.0f} %)"
    assert any(note.endswith(expected) for note in advice(profile)), advice(profile)
    assert not any("input pipeline" in note or "data loading" in note for note in advice(profile))


def test_without_psi_the_load_average_stands_in(tmp_path):
    """PSI absent (an older kernel): the real load average, read around the samples, per CPU of the host."""
    loadavg = Path("/proc/loadavg")
    before = pressure.parse_loadavg(loadavg.read_text())[0]
    host = pressure.HostPressure(psi=str(tmp_path / "no-psi"))
    for _ in range(3):
        host.sample()
    summary = host.summary()
    after = pressure.parse_loadavg(loadavg.read_text())[0]
    assert summary["source"] == "/proc/loadavg" and summary["scope"] == "host"
    assert set(host.loads) <= {before, after}  # the kernel updates it every 5 s: what was read, nothing else
    cpus = os.cpu_count() or 1
    assert summary["load_per_cpu"] == round(sum(host.loads) / len(host.loads) / cpus, 2)
    waited = [max(0.0, 1 - cpus / load) if load else 0.0 for load in host.loads]
    assert summary["pressure_pct"] == round(100 * sum(waited) / len(waited), 1)
    read = Profile.read({"version": 2, "kind": "cpu", "host_cpu": summary, "devices": [{"mean_util": 20.0}]})
    assert read is not None and read.host_cpu is not None
    assert read.host_cpu.describe() == f"load {summary['load_per_cpu']:.1f} per CPU"


def test_neither_file_means_no_host_figures(tmp_path):
    host = pressure.HostPressure(psi=str(tmp_path / "no-psi"), loadavg=str(tmp_path / "no-loadavg"))
    host.sample()
    assert host.summary() is None


@pytest.mark.parametrize(
    ("pressure_pct", "mean", "expected"),
    [
        (55.0, 25.0, "mean utilisation 25 %: the CPUs often waited: the host was busy (CPU pressure 55 %)"),
        (55.0, 5.0, "mean utilisation 5 %: the CPUs were mostly idle: the host was busy (CPU pressure 55 %)"),
        (3.0, 25.0, "mean utilisation 25 %: the CPUs often waited (input pipeline, small batches?)"),
        (None, 25.0, "mean utilisation 25 %: the CPUs often waited (input pipeline, small batches?)"),
        (55.0, 90.0, None),  # a busy task on a busy host: nothing to say
    ],
)
def test_the_advice_names_the_host_only_when_its_pressure_explains_the_wait(pressure_pct, mean, expected):
    host_cpu = None if pressure_pct is None else {"source": "/proc/pressure/cpu", "scope": "host"}
    if host_cpu is not None:
        host_cpu["pressure_pct"] = pressure_pct
    value = {"version": 2, "kind": "cpu", "host_cpu": host_cpu, "devices": [{"index": "cpu", "mean_util": mean}]}
    profile = Profile.read(value)
    assert profile is not None
    assert advice(profile) == ([expected] if expected else [])


def test_a_gpu_that_waited_on_a_busy_host_says_so_too():
    value = {
        "version": 2,
        "kind": "gpu",
        "host_cpu": {"source": "/proc/pressure/cpu", "scope": "container (fuse.lxcfs)", "pressure_pct": 40.0},
        "devices": [{"index": "0", "name": "NVIDIA L4", "mean_util": 30.0, "p95_util": 70.0}],
    }
    profile = Profile.read(value)
    assert profile is not None
    assert advice(profile) == [
        "GPU 0: mean utilisation 30 %: the GPU often waited: the container was busy (CPU pressure 40 %)"
    ]
