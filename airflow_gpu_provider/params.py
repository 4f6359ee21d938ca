"""DAG params for the trigger form: the GPU knobs with descriptions and the accepted values as choices."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

from airflow_gpu_provider.backends import BACKENDS as REGISTRY
from airflow_gpu_provider.backends import RUN_TIME_NAMES as BACKENDS
from airflow_gpu_provider.backends import describe_backends
from airflow_gpu_provider.task.missing_gpu import NAMES as MISSING_GPU_POLICIES

MIXED_PRECISION: tuple[str, ...] = ("no", "bf16", "fp16")


def gpu_params(
    *,
    gpu_count: int | None = 1,
    max_gpus: int = 8,
    mixed_precision: str | None = "no",
    backend: str = "local",
    on_missing_gpu: str = "cpu",
) -> dict[str, Any]:
    """``gpu_count``, ``mixed_precision``, ``backend`` and ``on_missing_gpu`` as :class:`~airflow.sdk.Param`.

    Use them in templates (``gpu_count="{{ params.gpu_count }}"``) or read them from ``params`` in the task.

    :param gpu_count: default GPU count; ``None`` leaves the param out (the task's count is fixed)
    :param max_gpus: the largest ``gpu_count`` the form accepts
    :param mixed_precision: default autocast dtype; ``None`` leaves the param out
    """
    params: dict[str, Any] = {}
    if gpu_count is not None:
        params["gpu_count"] = Param(
            gpu_count, type="integer", minimum=0, maximum=max_gpus, description="GPUs for each GPU task."
        )
    if mixed_precision is not None:
        params["mixed_precision"] = Param(
            mixed_precision,
            enum=list(MIXED_PRECISION),
            description="Autocast dtype for the forward pass ('no' keeps float32).",
        )
    params["backend"] = Param(
        backend,
        enum=list(BACKENDS),
        description=f"Where GPU tasks run: {describe_backends(BACKENDS)}."
        + "".join(
            f" {name!r} is chosen when the DAG is parsed, not here." for name in REGISTRY if name not in BACKENDS
        ),
    )
    params["on_missing_gpu"] = Param(
        on_missing_gpu,
        enum=list(MISSING_GPU_POLICIES),
        description="When GPUs are missing or busy: fail, wait for them, or run on the CPU.",
    )
    return params
