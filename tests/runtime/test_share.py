"""A share of one GPU inside the task (``runtime/share.py``): the line that says how it is enforced, PyTorch's cap,
the refusal where nothing enforces it, and a copy of the task process refused on a share.

PyTorch is installed here, without CUDA: its cap cannot be set, which is the case of a task with no way to enforce
its share. ``make gpu-check``'s ``shares`` row sets the cap on a real GPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from shipped_runtime import callable_envelope, run_runtime

from airflow_gpu_provider.runtime.protocol import EXIT_USER_ERROR, TASK_PID_ENV
from airflow_gpu_provider.task.callable import shipped_callable

SHARE = {"memory": 6 * 2**30, "fraction": 0.25, "percent": 25, "gpu": "GPU-0", "line": "a share of 6.0 GiB (25 %)"}


def loaded_torch() -> bool:
    import sys

    return "torch" in sys.modules


def _run(tmp_path: Path, share: dict, env: dict | None = None) -> tuple:
    summary = {"backend": "test", "image": "img", "resources": "0.25 of 1x nvidia GPU", "gpus": [], "share": share}
    envelope = {**callable_envelope(shipped_callable(loaded_torch, owner="test"), [], {}), "summary": summary}
    (tmp_path / "envelope.json").write_text(json.dumps(envelope))
    result = tmp_path / "result.json"
    done = run_runtime(str(tmp_path / "envelope.json"), str(result), env={**os.environ, **(env or {})}, timeout=120)
    return done, json.loads(result.read_text()) if result.exists() else None


def test_mps_enforces_the_share_outside_the_task_so_the_runtime_only_says_so(tmp_path):
    done, result = _run(tmp_path, {**SHARE, "enforcement": "mps", "line": "a share ..., enforced by MPS"})
    assert result["ok"] and result["return_value"] is False  # PyTorch not imported for it
    assert "[gpu] GPU share: a share ..., enforced by MPS" in done.stdout


def test_without_cuda_pytorchs_cap_cannot_be_set_and_the_try_is_refused(tmp_path):
    done, result = _run(tmp_path, {**SHARE, "enforcement": "framework", "unenforced_allowed": False})
    assert done.returncode == EXIT_USER_ERROR and not result["ok"]
    assert result["error"]["type"] == "ShareNotEnforced"
    assert (
        "cannot be enforced: PyTorch's cap could not be set (RuntimeError: torch.cuda.is_available() is False)"
        in (result["error"]["message"])
    )
    assert "loaded_torch() finished" not in done.stdout  # the function never ran


def test_an_admin_may_allow_an_unenforced_share(tmp_path):
    done, result = _run(tmp_path, {**SHARE, "enforcement": "framework", "unenforced_allowed": True})
    assert result["ok"] and result["return_value"] is True
    assert "GPU share NOT enforced: PyTorch's cap could not be set" in done.stdout


def test_a_copy_of_the_task_process_is_refused_on_a_share(tmp_path):
    """Lightning's ddp starts the task's script again as rank 1: on a share, each copy would take the share again."""
    done, result = _run(tmp_path, {**SHARE, "enforcement": "mps"}, env={TASK_PID_ENV: "1", "LOCAL_RANK": "1"})
    assert done.returncode == EXIT_USER_ERROR and result is None  # a copy never reports
    assert "a copy of the task process (a framework's own launch, such as Lightning's ddp) is refused" in done.stderr
