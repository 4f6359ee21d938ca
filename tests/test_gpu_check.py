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
CHECKS = [
    *("inventory", "allocator", "local-task", "cuda-cache", "demo-bf16", "profile", "accelerate", "oom"),
    *("shares", "share-throughput"),
]


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


def _shares_module():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check_shares
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return gpu_check_shares


MPS_SAID = [
    "[gpu] a share of 40.0 GiB (50 %) of GPU GPU-1 (NVIDIA H100), enforced by MPS (the provider's daemon): "
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50"
] * 2
HELD = {"gpu": "GPU-1", "above": "refused: CUDA out of memory. Tried to allocate", "mps_limit": "0=40960M"}


def test_the_share_rows_pass_only_for_two_enforced_shares_of_one_gpu():
    shares = _shares_module()
    assert shares.verdict_shares([HELD, HELD], MPS_SAID).endswith(
        "enforced by MPS (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M)"
    )
    capped = ["[gpu] a share of 50 % of GPU GPU-1 (H100), enforced by PyTorch's cap on its CUDA allocator (no MPS)"]
    assert "enforced by PyTorch's cap on its CUDA allocator" in shares.verdict_shares([HELD, HELD], capped)
    with pytest.raises(shares.ShareCheckError, match="share one GPU, they ran on"):
        shares.verdict_shares([HELD, {**HELD, "gpu": "GPU-2"}], MPS_SAID)
    with pytest.raises(shares.ShareCheckError, match="allocated 65% of the GPU while its share was 50%"):
        shares.verdict_shares([HELD, {**HELD, "above": "allocated"}], MPS_SAID)
    with pytest.raises(shares.ShareCheckError, match="does not say how the shares were enforced"):
        shares.verdict_shares([HELD, HELD], ["Starting task process on GPUs ['GPU-1']"])


def test_the_throughput_row_compares_the_makespans_and_fails_when_sharing_is_slower():
    shares = _shares_module()
    assert "6.00 s as two shares at once (MPS) vs 10.00 s one after the other" in shares.verdict_throughput(
        6.0, 10.0, "MPS"
    )
    assert "0.60x the time (1.67x the throughput)" in shares.verdict_throughput(6.0, 10.0, "MPS")
    with pytest.raises(shares.ShareCheckError, match="sharing made the pair slower"):
        shares.verdict_throughput(13.0, 10.0, "MPS")


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
