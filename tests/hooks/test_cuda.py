"""CudaHook: a no-op with one log line where CUDA is absent, and torch is never imported by it.

The CPU tests hide every GPU from torch (``CUDA_VISIBLE_DEVICES=""``), so they hold on any host; their ``gpu`` twins
show what the hook does with a real GPU.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from gpu_support import gpu_environment, nvidia_gpus

from airflow_gpu_provider.settings.units import format_bytes

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def run_probe(code: str, env: dict[str, str]) -> tuple[str, str]:
    """Run code in a fresh interpreter; return (last stdout line, all output)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    output = proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1], output


def test_clear_cache_without_torch_loaded_does_not_import_torch():
    last, output = run_probe(
        "import sys; from airflow_gpu_provider.hooks.cuda import CudaHook;"
        "r = CudaHook().clear_cache(); print(r['status'], '|', r['reason'], '|', 'torch' in sys.modules)",
        gpu_environment(),  # GPUs or not: a process that never loaded torch has no cache
    )
    assert last == "skipped | torch is not loaded | False"
    assert output.count("CUDA cache clear skipped") == 1


def test_clear_cache_with_torch_on_cpu_is_a_no_op():
    last, output = run_probe(
        "import torch; from airflow_gpu_provider.hooks.cuda import CudaHook;"
        "kept = torch.ones(1000); r = CudaHook().clear_cache();"
        "print(r['status'], '|', r['reason'], '|', r['freed_bytes'], '|', r['gc_rounds'] >= 1, '|', float(kept.sum()))",
        gpu_environment(**NO_GPU),
    )
    assert last == "skipped | CUDA is not available | 0 | True | 1000.0"
    assert output.count("CUDA cache clear skipped: CUDA is not available") == 1


def test_import_torch_option_loads_torch_in_a_fresh_process():
    last, _ = run_probe(
        "import sys; from airflow_gpu_provider.hooks.cuda import CudaHook;"
        "r = CudaHook(import_torch=True).clear_cache(); print(r['reason'], '|', 'torch' in sys.modules)",
        gpu_environment(**NO_GPU),
    )
    assert last == "CUDA is not available | True"


def test_inventory_and_memory_stats_are_the_hosts_gpus():
    """The inventory is NVML's (which ignores CUDA_VISIBLE_DEVICES): empty on a host without GPUs, else all of them."""
    from airflow_gpu_provider.hooks.cuda import CudaHook

    hook = CudaHook()
    assert [g["uuid"] for g in hook.get_inventory()] == list(nvidia_gpus()[0])
    # torch in this process sees no GPU (conftest), so the statistics are the devices' own, from NVML
    assert [(s["index"], s["total"] > 0) for s in hook.memory_stats()] == [
        (str(i), True) for i in range(len(nvidia_gpus()[0]))
    ]


# ------------------------------------------------------------------------------------------------ on a real GPU
@pytest.mark.gpu
def test_clear_cache_on_a_gpu_frees_the_cache_to_zero():
    last, output = run_probe(
        "import torch; from airflow_gpu_provider.hooks.cuda import CudaHook;"
        "block = torch.empty(64 * 2**20, dtype=torch.uint8, device='cuda'); del block;"
        "held = torch.cuda.memory_reserved(); r = CudaHook().clear_cache();"
        "print(held, '|', r['status'], '|', r['freed_bytes'], '|', torch.cuda.memory_reserved())",
        gpu_environment(),
    )
    held, status, freed, after = (part.strip() for part in last.split("|"))
    assert int(held) >= 64 * 2**20  # the caching allocator kept the freed block
    assert (status, int(freed), int(after)) == ("cleared", int(held), 0)
    assert output.count(f"CUDA cache cleared: {format_bytes(int(held))} freed") == 1


@pytest.mark.gpu
def test_import_torch_on_a_gpu_host_reports_cuda_never_initialised():
    last, _ = run_probe(
        "import sys; from airflow_gpu_provider.hooks.cuda import CudaHook;"
        "r = CudaHook(import_torch=True).clear_cache(); print(r['status'], '|', r['reason'])",
        gpu_environment(),
    )
    assert last == "skipped | CUDA was never initialised in this process"


@pytest.mark.gpu
def test_inventory_matches_nvidia_smi():
    from airflow_gpu_provider.hooks.cuda import CudaHook

    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on the PATH: nothing independent to compare NVML's inventory with")
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    rows = [[field.strip() for field in line.split(",")] for line in smi.splitlines() if line.strip()]
    inventory = CudaHook().get_inventory()
    assert [(g["index"], g["uuid"], g["name"]) for g in inventory] == [tuple(row[:3]) for row in rows]
    for gpu, row in zip(inventory, rows):  # NVML in bytes, nvidia-smi in MiB: the same memory, give or take rounding
        assert abs(gpu["memory_total"] / 2**20 - int(row[3])) <= 1, (gpu, row)
