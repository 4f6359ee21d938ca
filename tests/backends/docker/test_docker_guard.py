"""The guard of the tests that need Docker (docker_fixtures.require_docker), run in a child pytest.

Without an engine, or without a base image that can be built here, a test marked ``docker`` skips saying why and how
to fix it, and fails instead with ``AIRFLOW_GPU_REQUIRE_DOCKER=1`` (CI). None of this needs an engine: the child
points at a socket that does not exist, or lacks debootstrap.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# a test marked docker that uses no Docker fixture: the marker alone must guard it
TARGET = "tests/backends/kubernetes/test_k8s_pod_in_docker.py::test_exception_in_the_pod_shows_its_traceback_and_becomes_a_remote_task_error"


def child_pytest(**environment: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW_GPU_REQUIRE_DOCKER"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", TARGET],
        cwd=REPO,
        env={**env, **environment},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_without_an_engine_docker_tests_skip_saying_why():
    done = child_pytest(DOCKER_HOST="unix:///nonexistent/docker.sock")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout
    assert "no Docker engine is reachable at unix:///nonexistent/docker.sock" in done.stdout
    assert "point DOCKER_HOST at it" in done.stdout
    assert "set AIRFLOW_GPU_REQUIRE_DOCKER=1 to make this an error" in done.stdout


def test_without_an_engine_docker_tests_fail_in_ci():
    done = child_pytest(DOCKER_HOST="unix:///nonexistent/docker.sock", AIRFLOW_GPU_REQUIRE_DOCKER="1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 error" in done.stdout
    assert "AIRFLOW_GPU_REQUIRE_DOCKER=1 but no Docker engine is reachable" in done.stdout


def test_a_base_image_that_cannot_be_built_here_skips_saying_how_to_build_it():
    """No debootstrap on the PATH: the missing image cannot be built, and the message says what it needs.

    The engine is reached only if one runs; without one the test shows the engine message instead, so it needs none.
    """
    missing = f"airflow-gpu-base:never-built-{uuid.uuid4().hex[:8]}"
    path = os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if not os.path.exists(os.path.join(p, "debootstrap"))
    )
    done = child_pytest(AIRFLOW_GPU_TEST_BASE_IMAGE=missing, PATH=path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout
    if "no Docker engine is reachable" not in done.stdout:
        assert f"the base image {missing} is missing, and the tests cannot build it here" in done.stdout
        assert "debootstrap (apt-get install debootstrap)" in done.stdout
        assert f"sudo bash docker/base/build.sh {missing}" in done.stdout
