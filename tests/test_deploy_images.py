"""The images in docker/ build on the local Debian base image (``ARG BASE_IMAGE``) and work.

They go through the Docker tests' guard (the ``docker`` marker, ``tests/backends/docker/docker_fixtures.py``): it
builds a missing base image, and without an engine the tests skip, unless ``AIRFLOW_GPU_REQUIRE_DOCKER=1`` (set by
``.ci/run``): then they fail. The public CUDA PyTorch base cannot be pulled here: the training image is built as on it
(default ``TORCH_REQUIREMENT``: keep the base's torch) on the session's ``torch_image`` (the Debian base with the local
CPU torch wheel and accelerate, which the Docker Accelerate tests build anyway), so its build installs no torch again.
Both images are removed at the end.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
import uuid

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE
from conftest import REPO

from airflow_gpu_provider.version import __version__

pytestmark = [pytest.mark.docker, pytest.mark.slow]

BUILD_TIMEOUT = 900
SEPARATOR = "--- next script ---"


def _docker(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


def _build(kind: str, base: str) -> str:
    tag = f"airflow-gpu-{kind}:test-{uuid.uuid4().hex[:8]}"
    environment = {**os.environ, "PYTHON": sys.executable}
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(REPO / "docker" / "build.sh"), kind, tag, "--build-arg", f"BASE_IMAGE={base}"],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
        env=environment,
    )
    assert result.returncode == 0, f"{kind} image build failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    print(f"built {tag} in {time.monotonic() - started:.0f}s")
    return tag


@pytest.fixture
def image(request: pytest.FixtureRequest):
    kind = request.param
    tag = _build(kind, request.getfixturevalue("torch_image") if kind == "training" else BASE_IMAGE)
    try:
        yield tag
    finally:
        leftovers = _docker("ps", "-aq", "--filter", f"ancestor={tag}").stdout.split()
        if leftovers:
            _docker("rm", "-f", *leftovers, check=False)
        _docker("rmi", "-f", tag, check=False)
        assert leftovers == [], f"containers of {tag} were left behind"


def _run(tag: str, scripts: list[str], *env: str) -> list[str]:
    """Each script's output: all run in one container (each start costs seconds), stopping at the first failure."""
    options = [item for pair in (("-e", e) for e in env) for item in pair]
    script = "set -e\n" + f"\necho {SEPARATOR}\n".join(scripts)
    result = _docker("run", "--rm", *options, tag, "bash", "-c", script, timeout=300, check=False)
    assert result.returncode == 0, f"{script!r} failed in {tag}:\n{result.stdout}\n{result.stderr}"
    outputs = result.stdout.split(f"{SEPARATOR}\n")
    assert len(outputs) == len(scripts), result.stdout
    return outputs


@pytest.mark.parametrize("image", ["worker"], indirect=True)
def test_worker_image_lists_the_provider_and_imports_its_backends(image):
    listed, backend, imported, packages = _run(
        image,
        [
            "airflow providers list -o json 2>/dev/null",
            "airflow config get-value gpu backend 2>/dev/null",
            "python3 -c 'import airflow, pynvml, airflow_gpu_provider.backends.local;"
            " from airflow.providers.docker.hooks.docker import DockerHook;"
            " from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook;"
            " from airflow.sdk import task; print(airflow.__version__, task.gpu.__name__)'",
            "python3 -m pip list 2>/dev/null | cut -d' ' -f1",
        ],
    )
    providers = json.loads(listed.strip().splitlines()[-1])
    assert {
        "package_name": "airflow-gpu-provider",
        "version": __version__,
    }.items() <= next(p for p in providers if p["package_name"] == "airflow-gpu-provider").items()
    assert any(p["package_name"] == "apache-airflow-providers-docker" for p in providers)
    assert any(p["package_name"] == "apache-airflow-providers-cncf-kubernetes" for p in providers)
    assert backend.strip() == "local"
    assert imported.split() == ["3.3.2", "gpu_task"]
    assert "torch" not in packages


ACCELERATE_SCRIPT = """cat > /tmp/ranks.py <<'EOF'
from accelerate import Accelerator
accelerator = Accelerator()
print(f"rank {accelerator.process_index} of {accelerator.num_processes} on {accelerator.device}", flush=True)
EOF
ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 /tmp/ranks.py 2>/dev/null"""


def _envelope() -> str:
    from airflow_gpu_provider.task.callable import shipped_callable
    from airflow_gpu_provider.task.envelope import Envelope

    def matmul(size: int) -> dict:
        import torch

        product = torch.ones(size, size) @ torch.ones(size, size)
        return {"sum": float(product.sum()), "torch": torch.__version__}

    summary = {"backend": "docker", "image": "training", "requirements_hash": "none", "resources": "cpu"}
    envelope = Envelope.call(shipped_callable(matmul, owner="test"), [8], {}).to_json(summary=summary)
    return base64.b64encode(json.dumps(envelope).encode()).decode()


@pytest.mark.parametrize("image", ["training"], indirect=True)
def test_training_image_runs_the_runtime_and_accelerate(image):
    versions, out, ranks = _run(
        image,
        [
            "python3 -c 'import torch, accelerate; print(torch.__version__, accelerate.__version__)'",
            "python3 -m airflow_gpu_provider.runtime env:ENVELOPE /tmp/result.json && cat /tmp/result.json",
            ACCELERATE_SCRIPT,
        ],
        f"ENVELOPE={_envelope()}",
        "NVIDIA_VISIBLE_DEVICES=void",  # as the provider starts a CPU container: no GPU even where the runtime gives all
    )
    assert versions.startswith("2.13.0")
    assert "[gpu] backend=docker image=training" in out
    assert "[gpu] GPUs assigned: none (running on CPU)" in out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["ok"] is True
    assert result["return_value"]["sum"] == 8 * 8 * 8
    assert sorted(re.findall(r"rank (\d) of (\d) on cpu", ranks)) == [("0", "2"), ("1", "2")], ranks
