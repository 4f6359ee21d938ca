"""``backend_options`` of the local backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from airflow_gpu_provider.backends.options import WorkerOptions


@dataclass(frozen=True)
class LocalOptions(WorkerOptions):
    """The local backend's options: those of every backend that runs on the worker host (:class:`WorkerOptions`)."""

    backend: ClassVar[str] = "local"
