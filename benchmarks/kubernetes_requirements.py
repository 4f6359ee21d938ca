"""Kubernetes init container: what installing only the image's missing pins (uv) saves over ``pip --target``.

Both contenders are the init container the Kubernetes backend generates (the same command, environment and
arguments but the installer), run in Docker against an image that already ships numpy, for ``pandas`` (which needs
numpy).
uv resolves against the image and installs the missing pins; pip --target cannot see the image's packages and
installs numpy again. Printed: wall time per install (median of interleaved runs) and the bytes each leaves in the
shared directory. Needs Docker and PyPI access; no Kubernetes.

Run: ``.venv/bin/python benchmarks/kubernetes_requirements.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import alternate, report

from airflow_gpu_provider.backends.kubernetes.requirements import DEPS_DIR, requirements_plan
from airflow_gpu_provider.settings import ImageSettings

BASE = "airflow-gpu-base:bookworm"
IMAGE = "airflow-gpu-bench-numpy:latest"
REQUIREMENTS = ["pandas==2.2.3"]
RUNS = 3


def build_image() -> None:
    with tempfile.TemporaryDirectory() as context:
        Path(context, "Dockerfile").write_text(
            f"FROM {BASE}\nRUN python3 -m pip install --quiet --break-system-packages numpy==2.1.3\n"
        )
        subprocess.run(["docker", "build", "-q", "--rm", "--force-rm", "-t", IMAGE, context], check=True)


def init_container(installer: str) -> dict:
    """The init container the Kubernetes backend plans for REQUIREMENTS with this installer."""
    image = ImageSettings(requirements=REQUIREMENTS, python_package_installer=installer)
    plan = requirements_plan(
        image,
        mode="init-container",
        base_image=IMAGE,
        derived_image=None,
        installer_image=None,
        security_context={},
        resources={},
    )
    return plan.init_containers[0]


def install(installer: str, sizes: dict[str, int]) -> None:
    target = Path(tempfile.mkdtemp(prefix="bench-deps-"))
    try:
        init = init_container(installer)
        argv = ["docker", "run", "--rm", *(arg for e in init["env"] for arg in ("-e", f"{e['name']}={e['value']}"))]
        argv += ["-v", f"{target}:{DEPS_DIR}", "--entrypoint", init["command"][0], IMAGE, *init["command"][1:]]
        subprocess.run([*argv, *init["args"]], check=True, capture_output=True)
        sizes[installer] = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    finally:
        # the container wrote as root: delete from inside, so a non-root host user can remove the directory
        subprocess.run(
            ["docker", "run", "--rm", "-v", f"{target}:/t", BASE, "find", "/t", "-mindepth", "1", "-delete"],
            check=False,
        )
        shutil.rmtree(target, ignore_errors=True)


def main() -> int:
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "info"], capture_output=True, check=False).returncode
    ):
        print("kubernetes_requirements: no Docker engine; skipped")
        return 0
    build_image()
    sizes: dict[str, int] = {}
    try:
        times = alternate(
            RUNS,
            **{
                "uv, missing pins only (default)": lambda: install("uv", sizes),
                "pip --target, everything": lambda: install("pip", sizes),
            },
        )
    finally:
        subprocess.run(["docker", "rmi", "-f", IMAGE], capture_output=True, check=False)
    report(
        f"Kubernetes init container installing {REQUIREMENTS} into an image that has numpy",
        times,
        baseline="pip --target, everything",
        goal="< 1.0x",
    )
    ratio = sizes["uv"] / sizes["pip"]
    print(
        f"  bytes installed: uv {sizes['uv'] / 2**20:.1f} MiB, pip {sizes['pip'] / 2**20:.1f} MiB, "
        f"ratio {ratio:.3f}x   (goal < 1.0x: the image's numpy is not installed again)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
