"""The image a Docker task runs in: its parent image, or the derived image with its requirements installed."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.backends.docker.images.cache import evict_images, in_use
from airflow_gpu_provider.backends.docker.images.catalogue import cpu_only_reason
from airflow_gpu_provider.backends.docker.images.engine import ensure_derived_image, resolve_image
from airflow_gpu_provider.backends.docker.images.spec import derived_image_spec, worker_uv

if TYPE_CHECKING:
    from airflow_gpu_provider.backends.docker.plan import DockerPlan


@contextlib.contextmanager
def task_image(client: Any, plan: DockerPlan, log: logging.Logger) -> Iterator[str]:
    """The image to run: the parent image, or its derived image with the requirements installed.

    A derived image is held as in use for the block (``images/cache.py``): create the container inside it.
    """
    parent = resolve_image(client, plan.parent_image, plan.options.pull, log)
    image = plan.parent_image
    with contextlib.ExitStack() as held:
        if plan.request.image.requirements:
            uv = worker_uv(plan.request.image, plan.build, parent.get("Architecture"), log)
            spec = derived_image_spec(plan.parent_image, plan.request.image, plan.build, uv_binary=uv)
            lock_dir = f"{plan.host.state_dir}/docker-builds"
            held.enter_context(in_use(lock_dir, spec.tag_for(parent["Id"])))
            image, built = ensure_derived_image(
                client, spec, parent["Id"], lock_dir=lock_dir, push=plan.build.registry is not None, log=log
            )
            if built and plan.options.engine_is_local:  # a remote engine's other users are not this host's to see
                evict_images(client, lock_dir, plan.cache_size, log)
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
        yield image
