"""The runtime as every backend ships it: its archive (``task/runtime_zip.py``), run and imported from that file."""

from __future__ import annotations

import functools
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

from airflow_gpu_provider.host.state import runtime_file
from airflow_gpu_provider.task.runtime_zip import PACKAGE


@functools.cache
def runtime_path() -> Path:
    """The archive, written as the local backend writes it (into the test session's state dir)."""
    return runtime_file(os.environ["AIRFLOW__GPU__STATE_DIR"])


def shipped(module: str) -> ModuleType:
    """A module of the runtime imported from the archive (``airflow_gpu_runtime.<module>``), not from the source."""
    archive = str(runtime_path())
    if archive not in sys.path:
        sys.path.append(archive)
    loaded = importlib.import_module(f"{PACKAGE}.{module}")
    assert str(loaded.__file__).startswith(archive + os.sep), loaded.__file__
    return loaded


def run_runtime(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``python runtime.pyz ARGS...``, its output captured as text."""
    return subprocess.run([sys.executable, str(runtime_path()), *args], capture_output=True, text=True, **kwargs)


def callable_envelope(shipped_function: Any, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The protocol's JSON envelope of a function call, as a backend writes it (its summary added by the test)."""
    from airflow_gpu_provider.task.envelope import Envelope

    return Envelope.call(shipped_function, args, kwargs).to_json(summary={})


def command_envelope(command: list[str]) -> dict[str, Any]:
    """The protocol's JSON envelope of a command."""
    from airflow_gpu_provider.task.envelope import Envelope

    return Envelope.run(command).to_json(summary={})


def run_sampled_task(
    tmp_path: Path, body: str, *, env: dict[str, str] | None = None, interval: float = 0.1, **envelope: Any
) -> tuple[dict[str, Any], str]:
    """Run ``body`` as a task function in a real runtime process with profiling on; return (result envelope, log).

    :param envelope: keys that replace the envelope's (``profile=`` with more than the interval, for example)
    """
    source = "def task():\n" + textwrap.indent(textwrap.dedent(body), "    ")
    full = {
        "version": 2,
        "mode": "callable",
        "function": "task",
        "source": source,
        "summary": {"backend": "test", "gpus": []},
        "profile": {"interval_s": interval},
        **envelope,
    }
    (tmp_path / "envelope.json").write_text(json.dumps(full))
    done = run_runtime(
        str(tmp_path / "envelope.json"),
        str(tmp_path / "result.json"),
        env={**{k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}, **(env or {})},
        timeout=120,
    )
    return json.loads((tmp_path / "result.json").read_text()), done.stdout + done.stderr
