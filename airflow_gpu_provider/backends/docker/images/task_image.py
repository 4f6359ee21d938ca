"""The image a Docker task runs in: its parent image, or the derived image with its requirements installed."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.backends.docker.images.catalogue import cpu_only_reason
from airflow_gpu_provider.backends.docker.images.dockerfile import derived_image_spec, worker_uv
from airflow_gpu_provider.backends.docker.images.engine import ensure_derived_image, resolve_image

if TYPE_CHECKING:
    from airflow_gpu_provider.backends.docker.plan import DockerPlan


def task_image(client: Any, plan: DockerPlan, log: logging.Logger) -> str:
    """The image to run: the parent image, or its derived image with the requirements installed."""
    parent = resolve_image(client, plan.parent_image, plan.options.pull, log)
    image = plan.parent_image
    if plan.request.image.requirements:
        uv = worker_uv(plan.request.image, plan.build, parent.get("Architecture"), log)
        spec = derived_image_spec(plan.parent_image, plan.request.image, plan.build, uv_binary=uv)
        image, _ = ensure_derived_image(
            client,
            spec,
            parent["Id"],
            lock_dir=f"{plan.host.state_dir}/docker-builds",
            push=plan.build.registry is not None,
            log=log,
        )
    if plan.resources.host_config.get("device_requests"):  # an NVIDIA GPU task: is the image a CUDA one?
        config_ = parent.get("Config") or {}
        reason = cpu_only_reason(plan.parent_image, config_.get("Env") or (), config_.get("Labels") or {})
        if reason:
            log.warning(
                "GPUs were requested but the image %s looks CPU-only (%s): code inside may not see the GPUs. "
                "Use a CUDA image such as %s (see airflow_gpu_provider.backends.docker.images.catalogue).",
                plan.parent_image,
                reason,
                plan.cuda_image,
            )
    return image
