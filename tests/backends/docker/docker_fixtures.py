"""Fixtures and helpers for tests on a real Docker engine.

Every test that needs Docker goes through one guard, :func:`require_docker`: the ``docker`` marker calls it before
the test's fixtures are set up, and the ``docker_client`` fixture calls it too. It checks that an engine is reachable
(``DockerOptions().engine_url``: ``$DOCKER_HOST`` or the local socket) by docker-py and by the ``docker`` command, and
that the base image (``AIRFLOW_GPU_TEST_BASE_IMAGE``, default ``airflow-gpu-base:bookworm``) exists; a missing base
image is built once with ``docker/base/build.sh`` (it needs root and debootstrap; concurrent sessions build it once).
A local engine that is installed but not running is started, as ``.ci/run`` does (root, no ``DOCKER_HOST``), and
left running for the next session; its log is ``$TMPDIR/airflow-gpu-dockerd.log``.
When any of that cannot be had, the tests skip saying why and how to fix it, unless ``AIRFLOW_GPU_REQUIRE_DOCKER=1``
(set by ``.ci/run``): then they fail.
Derived images they build are named ``airflow-gpu-test-derived:*`` and removed at the end of the session, with the
dangling layers that this session's builds (and its killed workers') left behind. Containers and images of other
users of the engine are never counted or touched: only those with the provider's labels, and of those, another
live session's builds are left to it.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import hashlib
import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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


BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "docker" / "base" / "build.sh"
BUILD_TIMEOUT = 540  # debootstrap takes about a minute with a nearby mirror; within pytest-timeout's 600 s


def _unavailable(reason: str) -> None:
    if REQUIRE_DOCKER:
        pytest.fail(f"AIRFLOW_GPU_REQUIRE_DOCKER=1 but {reason}", pytrace=False)
    pytest.skip(f"{reason} (set AIRFLOW_GPU_REQUIRE_DOCKER=1 to make this an error)")


def _build_base_image(client: Any) -> str | None:
    """Build the missing base image with docker/base/build.sh; return why it could not be, or None."""
    needs = []
    if os.geteuid() != 0:
        needs.append("root (debootstrap runs as root)")
    if shutil.which("debootstrap") is None:
        needs.append("debootstrap (apt-get install debootstrap)")
    if needs:
        return (
            f"the base image {BASE_IMAGE} is missing, and the tests cannot build it here: docker/base/build.sh needs "
            f"{' and '.join(needs)}. Build it once with `sudo bash docker/base/build.sh {BASE_IMAGE}`"
        )
    name = hashlib.sha256(BASE_IMAGE.encode()).hexdigest()[:16]
    lock = os.open(
        Path(tempfile.gettempdir(), f"airflow-gpu-base-{name}.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600
    )
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test session may be building the same image: wait for it
        if client.images(name=BASE_IMAGE):
            return None
        print(
            f"\nbuilding the missing base image {BASE_IMAGE} with {BUILD_SCRIPT} ...", file=sys.__stderr__, flush=True
        )
        started = time.monotonic()
        build = subprocess.Popen(
            ["bash", str(BUILD_SCRIPT), BASE_IMAGE],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # debootstrap and its children: stopped as one group on timeout
        )
        try:
            output, _ = build.communicate(timeout=BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(build.pid, signal.SIGTERM)  # build.sh's EXIT trap removes its temporary root
            try:
                build.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(build.pid, signal.SIGKILL)
                build.communicate()
            return f"the base image {BASE_IMAGE} was missing and docker/base/build.sh took over {BUILD_TIMEOUT}s"
    finally:
        os.close(lock)
    if build.returncode != 0 or not client.images(name=BASE_IMAGE):
        output = output.strip()[-2000:]
        return f"the base image {BASE_IMAGE} was missing and docker/base/build.sh failed (exit {build.returncode}):\n{output}"
    print(f"built {BASE_IMAGE} in {time.monotonic() - started:.0f}s", file=sys.__stderr__, flush=True)
    return None


def _start_local_engine() -> None:
    """Start the installed ``dockerd`` when no engine answers on the local socket (root, no ``DOCKER_HOST``)."""
    if os.environ.get("DOCKER_HOST") or os.geteuid() != 0 or not (shutil.which("dockerd") and shutil.which("docker")):
        return
    lock = os.open(
        Path(tempfile.gettempdir(), "airflow-gpu-dockerd.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600
    )
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other xdist worker may be starting it: one engine
        if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0:
            return
        log = Path(tempfile.gettempdir(), "airflow-gpu-dockerd.log")
        with open(log, "ab") as out:
            subprocess.Popen(["dockerd"], stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
        print(f"\nstarted dockerd (log: {log})", file=sys.__stderr__, flush=True)
        for _ in range(120):
            if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0:
                return
            time.sleep(0.5)
    finally:
        os.close(lock)


@functools.cache
def _docker_state() -> tuple[Any, str | None]:
    """``(client, None)`` when Docker tests can run (the base image built if it was missing), else ``(None, why)``.

    Checked once per session: every test that needs Docker asks again, and gets the same answer at no cost.
    """
    url: Any = "the default socket"
    try:
        import docker
        from airflow_gpu_provider.backends.docker.options import DockerOptions

        url = DockerOptions().engine_url
        try:
            client = docker.APIClient(base_url=url, version="auto", timeout=60)
        except docker.errors.DockerException:
            _start_local_engine()  # installed but not running: start it, as .ci/run does
            client = docker.APIClient(base_url=url, version="auto", timeout=60)
        client.ping()
    except Exception as err:
        return None, (
            f"no Docker engine is reachable at {url} ({err}); start one (dockerd, as root) or point DOCKER_HOST at it"
        )
    if shutil.which("docker") is None:
        return (
            None,
            "the docker command is not installed (apt-get install docker.io): the tests and build scripts use it",
        )
    try:
        cli = subprocess.run(["docker", "version"], capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return None, "the docker command did not answer within 60s"
    if cli.returncode != 0:
        return None, f"the docker command cannot reach the engine: {cli.stderr.strip()[-500:]}"
    if not client.images(name=BASE_IMAGE):
        problem = _build_base_image(client)
        if problem:
            return None, problem
    return client, None


def require_docker() -> Any:
    """The guard of every test that needs Docker: a docker-py client, or skip (fail in CI) saying why."""
    client, problem = _docker_state()
    if problem:
        _unavailable(problem)
    return client


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``docker`` go through the guard before any of their fixtures runs."""
    if item.get_closest_marker("docker") is not None:
        require_docker()


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A docker-py client of the engine, with the base image present; cleans up the session's test images."""
    import docker

    client = require_docker()
    yield client
    from airflow_gpu_provider.backends.docker.images.builds import BUILDER_LABEL, reap_dead_builds
    from airflow_gpu_provider.host.workers import is_dead, worker_identity

    def ours(image: dict[str, Any]) -> bool:  # built by this session, or by a worker of it that is gone
        builder = (image.get("Labels") or {}).get(BUILDER_LABEL)
        return builder is not None and (builder == worker_identity() or is_dead(builder))

    # another live session's images are left to it; localhost:1/: test_unreachable_registry_push's built image
    for name in (TEST_REPOSITORY, f"localhost:1/{TEST_REPOSITORY}"):
        for image in client.images(name=name):
            if ours(image) and any(TEST_REPOSITORY in tag for tag in image.get("RepoTags") or ()):
                with contextlib.suppress(docker.errors.NotFound):
                    client.remove_image(image["Id"], force=True)
    reap_dead_builds(client, logging.getLogger("docker_client"))  # what this session's killed workers built
    for image in client.images(all=True, filters={"label": f"{BUILDER_LABEL}={worker_identity()}", "dangling": True}):
        with contextlib.suppress(docker.errors.APIError):  # still used by another image
            client.remove_image(image["Id"])


@pytest.fixture(scope="session")
def gpu_runtime_problem(docker_client: Any) -> str | None:
    """Why this engine cannot start GPU containers (no NVIDIA runtime), or ``None`` when it can.

    Found by doing it: a container from the base image with a one-GPU device request, started and removed.
    """
    import docker

    host_config = docker_client.create_host_config(
        device_requests=[docker.types.DeviceRequest(count=1, capabilities=[["gpu"]])]
    )
    container = docker_client.create_container(
        BASE_IMAGE, command=["true"], host_config=host_config, labels={"airflow-gpu-provider-test": "gpu-runtime-probe"}
    )
    try:
        docker_client.start(container["Id"])
        docker_client.wait(container["Id"], timeout=120)
    except docker.errors.APIError as err:
        return str(err.explanation)
    finally:
        docker_client.remove_container(container["Id"], force=True)
    return None


@pytest.fixture
def no_gpu_runtime(gpu_runtime_problem: str | None) -> None:
    """For tests of what happens on an engine without the NVIDIA runtime (the gpu-marked twins cover the other)."""
    if gpu_runtime_problem is None:
        pytest.skip(
            "this engine starts GPU containers (the NVIDIA runtime is installed): it cannot show the path "
            "of an engine without one; the gpu-marked tests check the GPU path instead"
        )


@pytest.fixture
def gpu_runtime(gpu_runtime_problem: str | None) -> None:
    """For gpu-marked tests that start GPU containers."""
    if gpu_runtime_problem is not None:
        pytest.skip(f"this host has a GPU, but the Docker engine cannot start GPU containers: {gpu_runtime_problem}")


def container_ids(client: Any) -> set[str]:
    """The engine's containers that this session made: task containers, build steps and install containers.

    Each names the worker (or builder) that made it: this test process, or a worker of it that is gone (a worker
    process a test killed, of this session's deployment: tests/conftest.py names one per test process). Other users
    of the same engine, and other test sessions, are left out: their containers are neither counted nor touched.
    """
    from airflow_gpu_provider.backends.docker.images.builds import build_containers
    from airflow_gpu_provider.host.workers import deployment, is_dead, worker_identity

    found = set()
    # builds' containers only: every container of a derived image inherits its labels (another session's too)
    for container in client.containers(all=True, filters={"label": TASK_LABEL}) + build_containers(client):
        labels = container.get("Labels") or {}
        owner = labels.get(f"{TASK_LABEL}.worker") or labels.get(f"{TASK_LABEL}.builder")
        ours = labels.get(f"{TASK_LABEL}.deployment") == deployment()  # not another session's dead workers'
        if owner is not None and (owner == worker_identity() or (ours and is_dead(owner))):
            found.add(container["Id"])
    return found


@pytest.fixture
def no_leaks(request: pytest.FixtureRequest, docker_client: Any) -> Iterator[None]:
    """Fail the test if it leaves one of the provider's containers behind (task or build-step containers).

    On the engine the test runs on: the host's, or the one ``docker_engine`` gives it (``authz_engine.py``).
    """
    from docker.errors import NotFound

    if "docker_engine" in request.fixturenames:
        docker_client = request.getfixturevalue("docker_engine")
    before = container_ids(docker_client)
    yield
    left = container_ids(docker_client) - before
    described = []
    for container_id in left:
        try:
            info = docker_client.inspect_container(container_id)
        except NotFound:  # a dead worker's, reaped meanwhile by another worker's task (the reaper's job)
            continue
        described.append(
            f"{container_id[:12]} {info['Config']['Image']} {info['State']['Status']} {info['Config']['Cmd']}"
        )
        docker_client.remove_container(container_id, force=True)
    assert not described, f"the test left {len(described)} container(s) behind: {described}"


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
def wheel_dir(build_inputs: Path) -> tuple[Path, str]:
    """A local wheel directory with a package whose version is new in every test, so its image is new too.

    It lies beneath ``[gpu_policy] allowed_build_paths`` and every local user may read it, as the build policy wants.
    """
    version = f"1.0.{time.time_ns()}"
    make_wheel(build_inputs / "wheels", "airflow_gpu_testpkg", version, f"VERSION = {version!r}\n")
    return build_inputs / "wheels", version


@pytest.fixture(scope="session")
def torch_image(docker_client: Any, airflow_home: Path) -> str:
    """A derived image with torch (the CPU wheel from /opt/wheels) and accelerate, built once per session.

    It stands in for the CUDA PyTorch images, which cannot be pulled here.
    """
    from uv import find_uv_bin

    from airflow_gpu_provider.backends.docker.images.engine import ensure_derived_image
    from airflow_gpu_provider.backends.docker.images.spec import BuildOptions, derived_image_spec
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
