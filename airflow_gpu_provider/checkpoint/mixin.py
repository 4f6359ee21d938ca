"""The ``checkpoint=`` argument that every GPU operator and decorator takes (the folder: ``task/checkpoint.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.checkpoint.location import CheckpointLocation, check_root, is_template, task_location

if TYPE_CHECKING:
    from airflow_gpu_provider.config.worker import GpuConfig


class CheckpointMixin:
    """Takes ``checkpoint=``: where this task's checkpoints go, checked when the DAG is parsed.

    :param checkpoint: an absolute path or an object-storage URI (``s3://bucket/ckpt``, an ``ObjectStoragePath``)
        under which the task's folder is made; ``False`` for none; default ``[gpu] checkpoint_root`` (templated)
    """

    task_id: str

    def __init__(self, *, checkpoint: Any = None, **kwargs: Any) -> None:
        owner = f"{type(self).__name__}({kwargs.get('task_id', '?')!r})"
        self.checkpoint = check_root(owner, "checkpoint", checkpoint)
        if isinstance(self.checkpoint, str) and not is_template(self.checkpoint):
            from airflow_gpu_provider.policy import Policy
            from airflow_gpu_provider.policy.checkpoints import check_root as permitted

            permitted(owner, "checkpoint", self.checkpoint, Policy.current())  # a templated root: when rendered
        super().__init__(**kwargs)

    def checkpoint_location(self, labels: Mapping[str, str], conf: GpuConfig) -> CheckpointLocation | None:
        """The folder of this try (rendered ``checkpoint``; none: ``[gpu] checkpoint_root``), or ``None`` for none."""
        return task_location(f"{type(self).__name__}({self.task_id!r})", self.checkpoint, labels, conf)
