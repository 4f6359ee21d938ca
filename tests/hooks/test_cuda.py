"""CudaHook on a machine without CUDA: a no-op with one log line, and torch is never imported by it."""

from __future__ import annotations

import subprocess
import sys


def run_probe(code: str) -> tuple[str, str]:
    """Run code in a fresh interpreter; return (last stdout line, all output)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    output = proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1], output


def test_clear_cache_without_torch_loaded_does_not_import_torch():
    last, output = run_probe(
        "import sys; from airflow_gpu_provider.hooks.cuda import CudaHook;"
        "r = CudaHook().clear_cache(); print(r['status'], '|', r['reason'], '|', 'torch' in sys.modules)"
    )
    assert last == "skipped | torch is not loaded | False"
    assert output.count("CUDA cache clear skipped") == 1


def test_clear_cache_with_torch_on_cpu_is_a_no_op():
    last, output = run_probe(
        "import torch; from airflow_gpu_provider.hooks.cuda import CudaHook;"
        "kept = torch.ones(1000); r = CudaHook().clear_cache();"
        "print(r['status'], '|', r['reason'], '|', r['freed_bytes'], '|', r['gc_rounds'] >= 1, '|', float(kept.sum()))"
    )
    assert last == "skipped | CUDA is not available | 0 | True | 1000.0"
    assert output.count("CUDA cache clear skipped: CUDA is not available") == 1


def test_import_torch_option_loads_torch_in_a_fresh_process():
    last, _ = run_probe(
        "import sys; from airflow_gpu_provider.hooks.cuda import CudaHook;"
        "r = CudaHook(import_torch=True).clear_cache(); print(r['reason'], '|', 'torch' in sys.modules)"
    )
    assert last == "CUDA is not available | True"


def test_inventory_and_memory_stats_are_empty_without_gpus():
    from airflow_gpu_provider.hooks.cuda import CudaHook

    hook = CudaHook()
    assert hook.get_inventory() == []
    assert hook.memory_stats() == []
