"""The runtime's sampler (runtime/telemetry/sampler.py ``Profiler``), in real task processes.

Without a GPU here, the NVML path runs against a replay of recorded nvidia-smi streams: ``libnvidia-ml.so.1``
built from ``tests/nvml_replay`` (real RTX 4090/4080 values, see its recordings/README.md), loaded by the
runtime's own ``ctypes`` code exactly as the driver's library would be.
"""

from __future__ import annotations

import csv
import os
import sys
import time
from pathlib import Path

import pytest
from nvml_replay import RECORDINGS, built_or_skip, replay_environment
from shipped_runtime import run_sampled_task as run_task
from shipped_runtime import shipped

sampler, proctree = shipped("telemetry.sampler"), shipped("telemetry.proctree")  # from the runtime's archive
stats = shipped("telemetry.stats")
PROFILE_POINTS, Profiler = sampler.PROFILE_POINTS, sampler.Profiler
TWO_GPUS = RECORDINGS / "rtx4090_rtx4080_2gpu.csv"
MIB = 2**20


def recorded(recording: Path) -> dict[str, list[dict[str, str]]]:
    """The recording's rows by UUID, in order."""
    with recording.open() as handle:
        rows = [{k.strip(): v.strip() for k, v in row.items()} for row in csv.DictReader(handle, skipinitialspace=True)]
    by_uuid: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_uuid.setdefault(row["uuid"], []).append(row)
    return by_uuid


@pytest.fixture(scope="module")
def replay_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_or_skip(tmp_path_factory.mktemp("nvml"))


def _phase_mean(profile: dict, start: float, end: float) -> float:
    """The mean CPU % of the samples that measured only the time between ``start`` and ``end`` (epoch seconds)."""
    interval, started = profile["interval_s"], profile["started"]
    samples = zip(profile["series"]["t"], profile["series"]["cpu"]["util"], strict=True)
    inside = [util for t, util in samples if util is not None and start + interval <= started + t <= end]
    assert len(inside) >= 3, profile["series"]
    return sum(inside) / len(inside)


def test_a_cpu_profile_of_the_whole_process_tree(tmp_path):
    """No NVML here: CPU % of the task and of the child it starts, and their memory, clearly labelled.

    The figures are held to the task's own account of its CPU time (``process_time``, ``RUSAGE_CHILDREN``): on a
    host whose other processes take the CPUs, both are lower, and they still agree.
    """
    body = """
        import resource, subprocess, sys, time
        start, own = time.time(), time.process_time()
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            pass
        middle, own = time.time(), time.process_time() - own
        burn = "import time\\nend = time.monotonic() + 1.5\\nwhile time.monotonic() < end: pass"
        subprocess.run([sys.executable, "-c", burn], check=True)
        child = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {"phases": [start, middle, time.time()], "cpu": [own, child.ru_utime + child.ru_stime]}
    """
    result, out = run_task(tmp_path, body, env={"CUDA_VISIBLE_DEVICES": ""})
    assert result["ok"]
    (start, middle, end), (own, child) = result["return_value"]["phases"], result["return_value"]["cpu"]
    profile = result["profile"]
    assert profile["kind"] == "cpu"
    assert "[gpu] profile: CPU profile of the task's processes (no GPU telemetry" in out
    [device] = profile["devices"]
    assert device["index"] == "cpu" and device["name"].startswith("CPU (task process tree, ")
    assert profile["samples"] >= 20 and profile["duration_s"] >= 3.0
    cpus = len(os.sched_getaffinity(0))
    # one busy core of `cpus` (at most 100/cpus %), in the task and then in its child, whose CPU is the task's
    for phase_start, phase_end, seconds in ((start, middle, own), (middle, end, child)):
        expected = 100 * seconds / (phase_end - phase_start) / cpus
        measured = _phase_mean(profile, phase_start, phase_end)
        assert abs(measured - expected) <= max(6.0, 0.3 * expected), (measured, expected, profile["host_cpu"])
    assert device["peak_memory"] > 10 * MIB and device["memory_total"] > device["peak_memory"]
    assert device["energy_wh"] is None and device["peak_power_w"] is None
    assert set(profile["series"]["cpu"]) == {"util", "memory_used"}  # no power, temperature or clock on a CPU


def test_a_replayed_nvml_stream_gives_the_recorded_figures(tmp_path, replay_lib):
    """Every visible GPU (no CUDA_VISIBLE_DEVICES: a container's), its recorded values row after row."""
    env = replay_environment(TWO_GPUS, replay_lib)
    result, out = run_task(tmp_path, "import time\ntime.sleep(1.5)\nreturn 1", env=env)
    profile = result["profile"]
    assert profile["kind"] == "gpu" and "CPU profile" not in out
    rows = recorded(TWO_GPUS)
    assert [d["uuid"] for d in profile["devices"]] == list(rows)
    samples = profile["samples"]
    for device, (uuid, stream) in zip(profile["devices"], rows.items(), strict=True):
        seen = stream[: min(samples, len(stream))]  # one row per sample, then the last row again
        seen += [stream[-1]] * (samples - len(seen))
        utils = [float(r["utilization.gpu [%]"]) for r in seen]
        assert device["name"] == stream[0]["name"] and device["uuid"] == uuid
        assert device["memory_total"] == int(stream[0]["memory.total [MiB]"]) * MIB
        assert device["mean_util"] == round(sum(utils) / len(utils), 1)
        assert device["peak_memory"] == max(int(r["memory.used [MiB]"]) for r in seen) * MIB
        assert device["peak_power_w"] == max(float(r["power.draw [W]"]) for r in seen)
        assert device["energy_wh"] > 0  # the driver's counter (the replay's: over the recording's own timestamps)
        assert device["p95_util"] == sorted(utils)[max(0, -(-len(utils) * 95 // 100) - 1)]
        assert profile["series"][device["index"]]["util"][1:4] == utils[1:4]


def test_only_the_gpus_the_task_was_given_by_uuid(tmp_path, replay_lib):
    """The local backend sets CUDA_VISIBLE_DEVICES to the allocated GPUs' UUIDs: those, and only those, are sampled."""
    second = list(recorded(TWO_GPUS))[1]
    env = {**replay_environment(TWO_GPUS, replay_lib), "CUDA_VISIBLE_DEVICES": second}
    result, _ = run_task(tmp_path, "return 1", env=env)
    assert [d["uuid"] for d in result["profile"]["devices"]] == [second]
    assert result["profile"]["devices"][0]["index"] == "1"  # NVML's index, as the summary names the GPU


@pytest.mark.parametrize("given_none", [{"CUDA_VISIBLE_DEVICES": ""}, {"NVIDIA_VISIBLE_DEVICES": "void"}])
def test_no_visible_gpu_means_a_cpu_profile_even_with_nvml(tmp_path, replay_lib, given_none):
    """A task given no GPU (the provider's CPU container: NVIDIA_VISIBLE_DEVICES=void) does not load NVML at all."""
    env = {**replay_environment(TWO_GPUS, replay_lib), **given_none}
    result, out = run_task(tmp_path, "return 1", env=env)
    assert result["profile"]["kind"] == "cpu"
    assert "no GPU telemetry: no GPU visible to the task" in out


def test_profiling_off_samples_nothing(tmp_path):
    result, out = run_task(tmp_path, "return 1", profile=None)
    assert "profile" not in result and "[gpu] profile" not in out


def test_a_command_runs_as_a_child_while_sampled_and_keeps_its_exit_status(tmp_path):
    envelope = {
        "mode": "command",
        "command": [sys.executable, "-c", "import time; time.sleep(0.5); raise SystemExit(3)"],
    }
    result, _ = run_task(tmp_path, "", **envelope)
    assert result["ok"] is False and result["exit_status"] == 3
    assert result["profile"]["samples"] >= 3


def test_the_series_stays_bounded_and_the_figures_exact_over_many_samples(monkeypatch):
    """Hours of samples: at most PROFILE_POINTS points come back; the mean and p95 are over every sample."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    profiler = Profiler(interval_s=3600)  # the thread takes its first sample, then waits: the test samples
    fed: list[float] = []

    def sample() -> list[list[float | None]]:
        fed.append(float(len(fed) * 37 % 101))
        return [[fed[-1], 2.0**40 + len(fed), None, None, None]]  # above any real RSS

    profiler.source.sample = sample
    for _ in range(10_001):
        profiler._sample()
    profiler.source.sample = lambda: [[fed[-1], 2.0**40 + len(fed), None, None, None]]  # stop()'s: the same again
    profile = profiler.stop()
    assert profile["samples"] == 10_002  # the thread's first (util unknown yet), the test's; stop()'s merged in
    assert len(fed) == 10_001
    assert len(profile["series"]["t"]) <= PROFILE_POINTS
    assert len(profile["series"]["cpu"]["util"]) == len(profile["series"]["t"])
    device = profile["devices"][0]
    assert device["p95_util"] == sorted(fed)[-(-len(fed) * 95 // 100) - 1]  # nearest rank
    assert device["mean_util"] == round(sum(fed) / len(fed), 1)
    assert device["peak_memory"] == 2**40 + len(fed)
    assert max(profile["series"]["cpu"]["memory_used"]) == device["peak_memory"]  # memory thins by max
    assert profile["series"]["t"] == sorted(profile["series"]["t"])


def test_a_sampling_error_is_one_log_line_and_the_task_goes_on(monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(proctree.ProcessTree, "sample", lambda self: 1 / 0)
    profiler = Profiler(interval_s=0.01)
    profiler.thread.join(timeout=5)
    profile = profiler.stop()
    assert profile["error"] == "ZeroDivisionError: division by zero"
    assert profile["samples"] == 0
    assert capsys.readouterr().out.count("[gpu] profile: sampling stopped (ZeroDivisionError") == 1


def test_a_final_sample_right_after_the_last_one_is_merged_into_it(monkeypatch):
    """The last sample used to span well under a millisecond and read 100 % (a whole clock tick over nothing):
    a final sample closer to the one before than the interval is merged into it."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    profiler = Profiler(interval_s=0.2)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:  # busy: CPU time accrues, in whole clock ticks
        pass
    profiler.stopping.set()
    profiler.thread.join()  # its own last sample may have come just now (1.0 s is a multiple of the interval):
    end = time.monotonic() + 0.1  # the last sample below spans 0.1 s of busy CPU whenever the thread's came
    while time.monotonic() < end:
        pass
    profiler._sample()  # the sampling thread's last sample...
    held = profiler.held  # (held back: the next sample might be merged into it)
    counted = profiler.samples
    profile = profiler.stop()  # ...and stop()'s, a few microseconds later
    assert held is not None and held.rows[0][0] is not None
    assert profile["samples"] == counted + 1 == len(profile["series"]["t"])  # one sample for both
    # the short span weighs by its time: next to nothing (a clock tick in a loaded machine's few ms moves it a little)
    assert profile["series"]["cpu"]["util"][-1] == pytest.approx(held.rows[0][0], abs=5)
    assert profile["series"]["t"][-1] >= held.at  # it ends when the sampling ended
    assert profile["duration_s"] >= profile["series"]["t"][-1]


def test_merging_two_samples_weights_by_time_and_keeps_peaks():
    """util, power and clock weighted by the time each sample stands for; memory and temperature the larger."""
    first = [[50.0, 4 * MIB, 100.0, 60.0, 1000.0], [None, MIB, None, None, None]]
    second = [[100.0, 2 * MIB, 300.0, 65.0, 2000.0], [20.0, None, None, None, None]]
    assert stats.combine(first, 3.0, second, 1.0) == [
        [62.5, 4 * MIB, 150.0, 65.0, 1250.0],  # (50*3 + 100*1) / 4, ...
        [20.0, MIB, None, None, None],  # an unknown value takes the other's
    ]
    assert stats.combine(first, 0.0, second, 0.0)[0][0] == 100.0  # no time at all: the later reading


def test_a_gpu_sample_lists_no_processes():
    """A process listing walks every process of the GPU under the driver's lock the task's CUDA calls take
    (docs/telemetry.md): the sampler never asks NVML for one (the NVML replay has none to give either)."""
    import airflow_gpu_provider.runtime.telemetry as telemetry

    source = "".join(path.read_text() for path in Path(telemetry.__file__).parent.glob("*.py"))
    assert "nvmlDeviceGetUtilizationRates" in source  # the sampler's own source
    for listing in ("RunningProcesses", "ProcessUtilization", "ProcessesUtilizationInfo", "AccountingPids"):
        assert listing not in source
