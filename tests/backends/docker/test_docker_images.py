"""Derived images on a real engine: built once per content hash, concurrently once, failures clear and clean."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE, TEST_REPOSITORY, container_ids
from backends.docker.user_engines import engines

from airflow_gpu_provider import config
from airflow_gpu_provider.backends.docker.backend import DockerBackend
from airflow_gpu_provider.backends.docker.images.engine import ImageError, ensure_derived_image
from airflow_gpu_provider.backends.docker.images.spec import CA_PATH, BuildOptions, derived_image_spec
from airflow_gpu_provider.backends.docker.options import DockerOptions
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.callable import shipped_callable
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaks")]
OPTIONS = {"repository": TEST_REPOSITORY}


def installed_version() -> dict:
    import os

    import airflow_gpu_testpkg

    return {"version": airflow_gpu_testpkg.VERSION, "ssl_cert_file": os.environ.get("SSL_CERT_FILE")}


def request(image: ImageSettings) -> TaskRequest:
    envelope = Envelope.call(shipped_callable(installed_version, owner="test"), [], {})
    return TaskRequest(ResourceSettings(), image, envelope, "fail", {"dag_id": "d", "task_id": "t"})


def image_with(wheels, version, **kwargs) -> ImageSettings:
    return ImageSettings(
        parent_image=BASE_IMAGE,
        requirements=[f"airflow-gpu-testpkg=={version}"],
        find_links=[str(wheels)],
        **kwargs,
    )


def test_requirements_from_a_local_wheel_dir_are_built_once_then_reused(docker_client, task_log, wheel_dir):
    wheels, version = wheel_dir
    backend = DockerBackend(DockerOptions.parse(OPTIONS), log=task_log[0])
    plan = backend.plan(request(image_with(wheels, version)), GpuConfig.read())
    assert backend.run(plan, {}).return_value["version"] == version
    assert task_log[1].count("Building derived image") == 1
    assert task_log[1].count(f"+ airflow-gpu-testpkg=={version}") == 1  # the install's output is in the task log

    assert backend.run(plan, {}).return_value["version"] == version
    assert task_log[1].count("Building derived image") == 1  # no rebuild
    assert task_log[1].count("Using cached derived image") == 1

    # the cache check alone, as the backend does it: parent lookup, content hash, tag lookup
    parent_id = docker_client.inspect_image(BASE_IMAGE)["Id"]
    started = time.perf_counter()
    spec = derived_image_spec(BASE_IMAGE, plan.request.image, BuildOptions(repository=TEST_REPOSITORY), uv_binary=None)
    spec_with_uv = derived_image_spec(
        BASE_IMAGE, plan.request.image, BuildOptions(repository=TEST_REPOSITORY), uv_binary="/uv"
    )
    reference, built = ensure_derived_image(
        docker_client, spec_with_uv, parent_id, lock_dir="/tmp", push=False, log=task_log[0]
    )
    assert time.perf_counter() - started < 1.0
    assert built is False
    assert spec.tag_for(parent_id) != reference  # pip-installed uv would be another image
    labels = docker_client.inspect_image(reference)["Config"]["Labels"]
    assert labels["airflow-gpu-provider.installer"] == "uv"
    assert labels["airflow-gpu-provider.parent"] == BASE_IMAGE


def test_concurrent_tasks_build_the_same_image_once(task_log, wheel_dir):
    wheels, version = wheel_dir
    image = image_with(wheels, version)
    results: list[object] = []

    def task() -> None:
        backend = DockerBackend(DockerOptions.parse(OPTIONS), log=task_log[0])
        results.append(backend.run(backend.plan(request(image), GpuConfig.read()), {}).return_value["version"])

    threads = [threading.Thread(target=task) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert results == [version] * 3
    assert task_log[1].count("Building derived image") == 1
    assert task_log[1].count("built by another task") == 2


@engines("host", "authz", "rootless")
def test_pip_installer_and_ca_bundle(task_log, wheel_dir, build_inputs, docker_engine):
    """On the host's engine, and on the one with the authorization plugin (a network-less namespace there: pip goes
    on to the wheel folder when the index cannot be reached; uv would not).
    """
    wheels, version = wheel_dir
    image = image_with(wheels, version, python_package_installer="pip")
    bundle = build_inputs / "ca.pem"  # beneath [gpu_policy] allowed_build_paths, as a task's own bundle must be
    bundle.write_bytes(Path("/etc/ssl/certs/ca-certificates.crt").read_bytes())
    backend = DockerBackend(DockerOptions.parse({**OPTIONS, "ca_bundle": str(bundle)}), log=task_log[0])
    result = backend.run(backend.plan(request(image), GpuConfig.read()), {}).return_value
    assert result == {"version": version, "ssl_cert_file": CA_PATH}
    assert "python3 -m pip install --no-cache-dir" in task_log[1].text


def test_uv_pip_installed_in_the_image_and_a_pypi_requirement(task_log, wheel_dir):
    """uv_source='pip' installs the worker's uv version in the image; six comes from PyPI through the proxy."""
    wheels, version = wheel_dir
    image = ImageSettings(
        parent_image=BASE_IMAGE,
        requirements=[f"airflow-gpu-testpkg=={version}", "six==1.16.0"],
        find_links=[str(wheels)],
    )
    backend = DockerBackend(DockerOptions.parse({**OPTIONS, "uv_source": "pip"}), log=task_log[0])
    assert backend.run(backend.plan(request(image), GpuConfig.read()), {}).return_value["version"] == version
    assert "python3 -m pip install --no-cache-dir uv==" in task_log[1].text
    assert "&& python3 -m uv pip install --system" in task_log[1].text
    assert "+ six==1.16.0" in task_log[1].text


def _dangling(docker_client) -> set[str]:
    """The dangling images this process's builds made (another session's are its own business)."""
    from airflow_gpu_provider.backends.docker.images.builds import builder_labels

    (label,) = (f"{key}={value}" for key, value in builder_labels().items())
    return {i["Id"] for i in docker_client.images(all=True, filters={"dangling": True, "label": label})}


def test_failing_requirement_install_is_a_clear_error_and_leaves_no_container(docker_client, task_log, build_inputs):
    tmp_path = build_inputs
    before, images_before = container_ids(docker_client), _dangling(docker_client)
    image = ImageSettings(
        parent_image=BASE_IMAGE,
        requirements=["airflow-gpu-provider-no-such-package==9.9.9"],
        environment={"BUILD_NONCE": str(time.time_ns())},  # not a build input: the steps before RUN are cached
        find_links=[str(tmp_path)],  # a new, empty wheel folder: steps before the install that no cache has
    )
    backend = DockerBackend(DockerOptions.parse(OPTIONS), log=task_log[0])
    with pytest.raises(ImageError, match="Could not build the derived image") as excinfo:
        backend.run(backend.plan(request(image), GpuConfig.read()), {})
    message = str(excinfo.value)
    assert "airflow-gpu-provider-no-such-package" in message  # the installer's own words are in the error
    assert "failed (exit status" in message
    assert container_ids(docker_client) == before
    assert _dangling(docker_client) <= images_before  # nor the images of the steps that succeeded
    assert list((Path(config.get("state_dir")) / "docker-builds").glob("*.lock")) == []  # no lock file piles up


def test_unreachable_registry_push_is_a_clear_error(task_log, wheel_dir):
    """A configured registry: the image is looked up there, built, then pushed; an unreachable one fails clearly."""
    wheels, version = wheel_dir
    backend = DockerBackend(DockerOptions.parse({**OPTIONS, "registry": "localhost:1"}), log=task_log[0])
    with pytest.raises(ImageError, match=r"Pushing localhost:1/airflow-gpu-test-derived:.* failed"):
        backend.run(backend.plan(request(image_with(wheels, version)), GpuConfig.read()), {})
    assert "is not in the registry yet; building it" in task_log[1].text


def uses_the_private_package() -> dict:
    import airflow_gpu_private

    return {"private": airflow_gpu_private.SECRET_PACKAGE}


def _layer_files(docker_client, image_id: str, tmp_path: Path) -> dict[str, bytes]:
    """Every file of every layer of an image (``docker save``): ``{layer/path: content}``."""
    saved = tmp_path / "saved.tar"
    with saved.open("wb") as handle:
        for chunk in docker_client.get_image(image_id):
            handle.write(chunk)
    files = {}
    with tarfile.open(saved) as image:
        for member in image.getmembers():
            if not member.isfile() or not (member.name.endswith("layer.tar") or member.name.startswith("blobs/")):
                continue
            data = image.extractfile(member)
            try:
                with tarfile.open(fileobj=data) as layer:
                    for entry in layer:
                        if entry.isfile():
                            files[f"{member.name}:{entry.name}"] = layer.extractfile(entry).read()
            except tarfile.ReadError:
                continue  # a config or manifest blob, not a layer
    saved.unlink()
    return files


def test_index_credentials_stay_out_of_every_layer_the_history_and_the_log(docker_client, task_log, tmp_path):
    """The requirements come from a password-protected index; no layer of the derived image holds the password.

    (uv: pip refuses a plain-HTTP index on another host, as this test's index is; pip's netrc use is shown by the
    local venv test.)
    """
    from backends.docker.docker_fixtures import make_wheel
    from private_index import docker_host_address, private_index

    make_wheel(tmp_path / "wheels", "airflow_gpu_private", "1.0", "SECRET_PACKAGE = True\n")
    with private_index(tmp_path / "wheels") as index:
        image = ImageSettings(
            parent_image=BASE_IMAGE,
            requirements=["airflow-gpu-private==1.0"],
            index_url=index.url(docker_host_address()),
        )
        envelope = Envelope.call(shipped_callable(uses_the_private_package, owner="test"), [], {})
        backend = DockerBackend(DockerOptions.parse(OPTIONS), log=task_log[0])
        plan = backend.plan(
            TaskRequest(ResourceSettings(), image, envelope, "fail", {"dag_id": "d", "task_id": "t"}), GpuConfig.read()
        )
        assert backend.run(plan, {}).return_value == {"private": True}
        assert index.authorized
    secrets = (index.password, f"login {index.user}")
    assert index.password not in task_log[1].text
    assert "python3 /airflow-gpu-build/runtime.pyz install" in task_log[1].text  # the credentialed install
    label = f"airflow-gpu-provider.requirements-hash={image.requirements_hash}"
    derived = next(i for i in docker_client.images(name=TEST_REPOSITORY, filters={"label": label}))
    history = subprocess.run(
        ["docker", "history", "--no-trunc", derived["Id"]], capture_output=True, text=True, check=True
    ).stdout
    assert index.password not in history and index.user not in history
    assert index.password not in json.dumps(docker_client.inspect_image(derived["Id"]))
    assert "airflow-gpu-provider.recipe" not in derived["Labels"]  # never the base of a rebuild (reuse.py)
    files = _layer_files(docker_client, derived["Id"], tmp_path)
    assert any("airflow_gpu_private/__init__.py" in name for name in files)  # the layers were read
    assert not [name for name, data in files.items() if any(s.encode() in data for s in secrets)]
    assert not [name for name in files if name.endswith("netrc")]
    assert docker_client.containers(all=True, filters={"label": label}) == []  # the install container is gone
    # nothing of this build on the engine holds the password: every image it made is the image or its parent
    made = docker_client.images(all=True, filters={"label": label})
    assert {i["Id"] for i in made} <= _ancestors(docker_client, derived["Id"])


def _ancestors(docker_client, image_id: str) -> set[str]:
    found = set()
    while image_id:
        found.add(image_id)
        image_id = docker_client.inspect_image(image_id).get("Parent") or ""
    return found


def test_a_worker_killed_during_a_build_leaves_nothing_once_the_next_build_ran(
    docker_client, task_log, tmp_path, wheel_dir
):
    """Killed while its install runs: its install container (and the netrc in it) is removed by the next build.

    The next build is another image: what removes the leftovers is the reaper, not a build that reuses them.
    """
    from backends.docker.build_worker import credentialed_image
    from backends.docker.docker_fixtures import make_wheel
    from private_index import docker_host_address, private_index

    version = f"1.0.{time.time_ns()}"
    make_wheel(tmp_path / "private", "airflow_gpu_private", version, "SECRET_PACKAGE = True\n")
    requirement = f"airflow-gpu-private=={version}"
    script = Path(__file__).with_name("build_worker.py")
    with private_index(tmp_path / "private", delay=120) as index:  # the install waits on the index
        url = index.url(docker_host_address())
        worker = subprocess.Popen(
            [sys.executable, str(script), url, requirement, str(tmp_path / "locks")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 240
            while not index.requests and worker.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert index.requests, worker.communicate(timeout=60)[0].decode()[-3000:]
        finally:
            worker.kill()
            worker.wait()
    label = f"airflow-gpu-provider.requirements-hash={credentialed_image(url, requirement).requirements_hash}"
    left = docker_client.containers(all=True, filters={"label": label}) + docker_client.images(
        all=True, filters={"label": label}
    )
    assert left  # what the killed build left, for now: its install container (a build stage's images before)

    wheels, plain_version = wheel_dir
    backend = DockerBackend(DockerOptions.parse(OPTIONS), log=task_log[0])
    assert (
        backend.run(backend.plan(request(image_with(wheels, plain_version)), GpuConfig.read()), {}).return_value[
            "version"
        ]
        == plain_version
    )
    assert docker_client.containers(all=True, filters={"label": label}) == []
    assert docker_client.images(all=True, filters={"label": label}) == []
    assert "left by a build whose worker died" in task_log[1].text


def test_derived_images_stay_within_cache_size_least_recently_used_first_never_one_in_use(
    docker_client, task_log, build_inputs, state_dir, monkeypatch
):
    """Hygiene (issue 27): derived images piled up on the engine. One byte of cache_size: each build removes this
    state dir's other derived images, least recently used first, but never one a task holds."""
    from backends.docker.docker_fixtures import make_wheel

    from airflow_gpu_provider.backends.docker.images.cache import in_use

    monkeypatch.setenv("AIRFLOW__GPU__CACHE_SIZE", "1")
    versions = [f"1.0.{time.time_ns()}{n}" for n in range(3)]
    for version in versions:
        make_wheel(build_inputs / "wheels", "airflow_gpu_testpkg", version, f"VERSION = {version!r}\n")
    backend = DockerBackend(DockerOptions.parse(OPTIONS), log=task_log[0])
    plans = [backend.plan(request(image_with(build_inputs / "wheels", v)), GpuConfig.read()) for v in versions]
    tags = []
    for plan in plans[:2]:
        assert backend.run(plan, {}).return_value["version"] == plan.request.image.requirements[0].split("==")[1]
        tags.append(task_log[1].text.rsplit("Building derived image ", 1)[1].split()[0])  # this build's tag
    assert docker_client.images(name=tags[0]) == []  # the first went when the second was built
    assert f"Removed derived image {tags[0]} (" in task_log[1].text
    with in_use(state_dir / "docker-builds", tags[1]):  # a task still holds the second
        assert backend.run(plans[2], {}).return_value["version"] == versions[2]
    assert docker_client.images(name=tags[1]) != []  # kept: in use while the third was built
