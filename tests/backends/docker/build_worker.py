"""A worker that builds one derived image, for a test to kill halfway: ``python build_worker.py INDEX REQUIREMENT LOCKS``.

The image is the base image plus ``REQUIREMENT`` from the index ``INDEX`` (credentials in its URL), built as the Docker
backend builds it (``ensure_derived_image``), with the worker's uv.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from backends.docker.docker_fixtures import BASE_IMAGE, TEST_REPOSITORY


def credentialed_image(index_url: str, requirement: str):
    from airflow_gpu_provider.settings import ImageSettings

    return ImageSettings(parent_image=BASE_IMAGE, requirements=[requirement], index_url=index_url)


if __name__ == "__main__":
    from uv import find_uv_bin

    import docker
    from airflow_gpu_provider.backends.docker.images.engine import ensure_derived_image
    from airflow_gpu_provider.backends.docker.images.spec import BuildOptions, derived_image_spec

    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    client = docker.APIClient(version="auto", timeout=300)
    image = credentialed_image(sys.argv[1], sys.argv[2])
    spec = derived_image_spec(BASE_IMAGE, image, BuildOptions(repository=TEST_REPOSITORY), uv_binary=find_uv_bin())
    parent = client.inspect_image(BASE_IMAGE)["Id"]
    ensure_derived_image(client, spec, parent, lock_dir=sys.argv[3], push=False, log=logging.getLogger("build"))
