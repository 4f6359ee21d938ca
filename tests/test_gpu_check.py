"""scripts/gpu_check.py (``make gpu-check``): its command line and its answer on a machine without a GPU everywhere;
the real checks on a GPU machine (marked ``gpu``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gpu_support import gpu_environment, nvidia_gpus

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.py"
CHECKS = ["inventory", "allocator", "local-task", "cuda-cache", "demo-bf16", "profile", "accelerate", "oom"]


def gpu_check(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def test_list_names_every_check_and_needs_no_gpu():
    done = gpu_check("--list")
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == CHECKS


def test_an_unknown_check_is_refused_naming_the_checks():
    done = gpu_check("--only", "inventory,no-such-check")
    assert done.returncode == 2
    assert "unknown check(s) ['no-such-check']" in done.stderr
    assert "the checks are: " + ", ".join(CHECKS) in done.stderr


def test_the_table_lines_up():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from gpu_check import format_table
    finally:
        sys.path.remove(str(SCRIPT.parent))
    table = format_table([("inventory", "PASS", "1 GPU(s)"), ("cuda-cache", "FAIL", "reserved 2 MiB")]).splitlines()
    assert table[0] == "check      | result | detail"
    assert table[2] == "inventory  | PASS   | 1 GPU(s)"
    assert table[3] == "cuda-cache | FAIL   | reserved 2 MiB"
    assert len({line.index("|") for line in table if "|" in line}) == 1


def test_without_a_gpu_it_says_so_and_fails_without_checking_anything(tmp_path):
    if nvidia_gpus()[0]:
        pytest.skip("this machine has an NVIDIA GPU: the no-GPU answer cannot be seen here (the gpu test runs instead)")
    done = gpu_check("--log-dir", str(tmp_path), env=gpu_environment())
    assert done.returncode == 2
    assert "gpu-check: no NVIDIA GPU on this machine (NVML:" in done.stderr
    assert "Nothing was checked" in done.stderr
    assert "PASS" not in done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []  # no check ran


@pytest.mark.gpu
@pytest.mark.slow
def test_every_gpu_path_passes_on_this_gpu_machine(tmp_path, airflow_home):
    done = gpu_check("--log-dir", str(tmp_path), env=gpu_environment(AIRFLOW_HOME=str(airflow_home)), timeout=1200)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    rows = [line.split("|") for line in done.stdout.splitlines() if line.count("|") == 2]
    assert {name.strip(): result.strip() for name, result, _ in rows[1:]} == dict.fromkeys(CHECKS, "PASS")
