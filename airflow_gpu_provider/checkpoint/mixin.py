"""Where a GPU operator's try keeps its checkpoints: the folder of ``checkpoint=`` (``TaskSpec.checkpoint``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.checkpoint.location import CheckpointLocation, task_location

if TYPE_CHECKING:
    from airflow_gpu_provider.config.worker import GpuConfig


class CheckpointMixin:
    """The try's checkpoint folder, from the rendered ``checkpoint``.

    ``checkpoint`` is a template field, checked at parse with the task's other arguments (``operators/arguments.py``).
    """

    checkpoint: Any
    task_spec: Any

    def checkpoint_location(self, labels: Mapping[str, str], conf: GpuConfig) -> CheckpointLocation | None:
        """The folder of this try (rendered ``checkpoint``; none: ``[gpu] checkpoint_root``), or ``None`` for none."""
        return task_location(self.task_spec.owner, self.checkpoint, labels, conf)
