"""A fourth backend, exactly as docs/architecture.md sketches one: an options half, a run half, a registry entry.

It runs the task in a plain child process (no GPUs, no allocator): enough to show that a backend only translates
the request and speaks the runtime's protocol, and that nothing else in the provider changes to add one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from airflow_gpu_provider.backends.base import Backend
from airflow_gpu_provider.backends.options import BackendOptions, option, text
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.host.state import runtime_file
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.result import TaskResult, result_value


@dataclass(frozen=True)
class InlineOptions(BackendOptions):
    """``python``: the interpreter that runs the task."""

    backend: ClassVar[str] = "inline"

    python: str = option(sys.executable, check=text)


@dataclass(frozen=True)
class InlinePlan:
    request: TaskRequest
    python: str


class InlineBackend(Backend[InlineOptions, InlinePlan]):
    name = "inline"

    def plan(self, request: TaskRequest, conf: GpuConfig) -> InlinePlan:
        return InlinePlan(request, self.options.python)

    def run(self, plan: InlinePlan, context: Any) -> TaskResult:
        envelope = plan.request.runtime_envelope(backend=self.name, image="inline", gpus=[])
        with tempfile.TemporaryDirectory() as folder:
            Path(folder, "envelope.json").write_text(json.dumps(envelope))
            result_path = Path(folder, "result.json")
            proc = subprocess.run(
                [plan.python, str(runtime_file(folder)), str(Path(folder, "envelope.json")), str(result_path)],
                capture_output=True,
                text=True,
                check=False,
            )
            self.log.info("%s", proc.stdout)
            result = json.loads(result_path.read_text()) if result_path.exists() else None
        return TaskResult(result_value(result, proc.returncode, where="the inline process"))
