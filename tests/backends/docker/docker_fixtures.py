"""Fixtures and helpers for tests on a real Docker engine.

Without an engine these tests skip, unless ``AIRFLOW_GPU_REQUIRE_DOCKER=1`` (set by ``.ci/run``): then they fail.
Derived images they build are named ``airflow-gpu-test-derived:*`` and removed at the end of the session, with the
dangling layers that derived-image builds left behind. Containers and images of other users of the engine are never
counted or touched: only those with the provider's labels.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import logging
import os
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BASE_IMAGE = os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm")
TEST_REPOSITORY = "airflow-gpu-test-derived"
REQUIRE_DOCKER = os.environ.get("AIRFLOW_GPU_REQUIRE_DOCKER") == "1"
TASK_LABEL = "airflow-gpu-provider"
DERIVED_LABEL = "airflow-gpu-provider.derived"


def _unavailable(reason: str) -> None:
    if REQUIRE_DOCKER:
        pytest.fail(f"AIRFLOW_GPU_REQUIRE_DOCKER=1 but {reason}", pytrace=False)
    pytest.skip(f"{reason} (set AIRFLOW_GPU_REQUIRE_DOCKER=1 to make this an error)")


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A docker-py client of the engine, with the base image present; cleans up the session's test images."""
    try:
        import docker
        from airflow_gpu_provider.backends.docker.options import DockerOptions

        client = docker.APIClient(base_url=DockerOptions().engine_url, version="auto", timeout=60)
        client.ping()
    except Exception as err:
        _unavailable(f"no Docker engine is reachable ({err})")
    if not client.images(name=BASE_IMAGE):
        _unavailable(f"the base image {BASE_IMAGE} is missing (build it with docker/base/build.sh)")
    yield client
    for image in client.images(filters={"label": DERIVED_LABEL}) + client.images(name=TEST_REPOSITORY):
        if any(TEST_REPOSITORY in tag for tag in image.get("RepoTags") or ()):
            with contextlib.suppress(docker.errors.NotFound):
                client.remove_image(image["Id"], force=True)
    for image in client.images(all=True, filters={"dangling": True, "label": DERIVED_LABEL}):
        with contextlib.suppress(docker.errors.APIError):  # still used by another image
            client.remove_image(image["Id"])


def container_ids(client: Any) -> set[str]:
    """The engine's containers that this provider made: task containers and derived-image build steps.

    Other users of the same engine are left out: their containers are neither counted nor touched.
    """
    return {
        c["Id"] for label in (TASK_LABEL, DERIVED_LABEL) for c in client.containers(all=True, filters={"label": label})
    }


@pytest.fixture
def no_leaks(docker_client: Any) -> Iterator[None]:
    """Fail the test if it leaves one of the provider's containers behind (task or build-step containers)."""
    before = container_ids(docker_client)
    yield
    left = container_ids(docker_client) - before
    described = []
    for container_id in left:
        info = docker_client.inspect_container(container_id)
        described.append(
            f"{container_id[:12]} {info['Config']['Image']} {info['State']['Status']} {info['Config']['Cmd']}"
        )
        docker_client.remove_container(container_id, force=True)
    assert not left, f"the test left {len(left)} container(s) behind: {described}"


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def text(self) -> str:
        return "\n".join(r.getMessage() for r in self.records)

    def count(self, text: str) -> int:
        return sum(text in r.getMessage() for r in self.records)


@pytest.fixture
def task_log() -> Iterator[tuple[logging.Logger, ListHandler]]:
    """A logger standing in for the task log, and the lines it received."""
    logger = logging.getLogger(f"test.docker.{uuid.uuid4().hex}")
    handler = ListHandler()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, handler
    logger.removeHandler(handler)


def make_wheel(directory: Path, name: str, version: str, code: str) -> Path:
    """Write a pure-Python wheel ``name==version`` whose package ``name`` holds ``code``."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": code.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = io.StringIO()
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{path},sha256={digest},{len(data)}\n")
    record.write(f"{dist}/RECORD,,\n")
    files[f"{dist}/RECORD"] = record.getvalue().encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


@pytest.fixture
def wheel_dir(tmp_path: Path) -> tuple[Path, str]:
    """A local wheel directory with a package whose version is new in every test, so its image is new too."""
    version = f"1.0.{time.time_ns()}"
    make_wheel(tmp_path / "wheels", "airflow_gpu_testpkg", version, f"VERSION = {version!r}\n")
    return tmp_path / "wheels", version


@pytest.fixture(scope="session")
def torch_image(docker_client: Any, airflow_home: Path) -> str:
    """A derived image with torch (the CPU wheel from /opt/wheels) and accelerate, built once per session.

    It stands in for the CUDA PyTorch images, which cannot be pulled here.
    """
    from uv import find_uv_bin

    from airflow_gpu_provider.backends.docker.images.dockerfile import BuildOptions, derived_image_spec
    from airflow_gpu_provider.backends.docker.images.engine import ensure_derived_image
    from airflow_gpu_provider.settings import ImageSettings

    wheels = Path("/opt/wheels")
    if not any(wheels.glob("torch-*.whl")):
        pytest.skip("no torch wheel in /opt/wheels to build an image with torch")
    image = ImageSettings(
        parent_image=BASE_IMAGE, requirements=["torch==2.13.0", "accelerate==1.15.0"], find_links=[str(wheels)]
    )
    spec = derived_image_spec(BASE_IMAGE, image, BuildOptions(repository=TEST_REPOSITORY), uv_binary=find_uv_bin())
    reference, _ = ensure_derived_image(
        docker_client,
        spec,
        docker_client.inspect_image(BASE_IMAGE)["Id"],
        lock_dir=str(airflow_home / "locks"),
        push=False,
        log=logging.getLogger("torch_image"),
    )
    return reference
