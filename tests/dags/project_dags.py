"""A task imports modules that lie next to its DAG file (plmod.py, the package plpkg/): from the DAG's folder on
the local backend, shipped with ``modules=`` into a Docker container.
"""

from __future__ import annotations

import datetime
import os

from airflow.sdk import DAG

from airflow_gpu_provider import ImageSettings, gpu_task

START = datetime.datetime(2024, 1, 1)
IMAGE = ImageSettings(parent_image=os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm"))


def uses_project_code() -> dict:
    import subprocess
    import sys

    import plmod
    import plpkg.layers

    child = subprocess.run(  # a process the task starts (a framework's rank) imports them too
        [sys.executable, "-c", "import plmod; print(plmod.double(4))"], capture_output=True, text=True, check=True
    )
    return {
        "double": plmod.double(21),
        "layers": plpkg.layers.NAME,
        "plmod_file": plmod.__file__,
        "layers_file": plpkg.layers.__file__,
        "child": child.stdout.strip(),
    }


with DAG("project_modules_local", schedule=None, start_date=START):
    gpu_task(task_id="from_the_dag_folder")(uses_project_code)()
    gpu_task(task_id="shipped", modules=["plmod", "plpkg"])(uses_project_code)()

with DAG("project_modules_docker", schedule=None, start_date=START):
    gpu_task(task_id="shipped", backend="docker", image=IMAGE, modules=["plmod", "plpkg"], memory="512Mi")(
        uses_project_code
    )()

# Kubernetes: rendered, and the pod's containers run in Docker (tests/task/test_project_modules.py)
with DAG("project_modules_kubernetes", schedule=None, start_date=START):
    gpu_task(task_id="shipped", backend="kubernetes", image=IMAGE, modules=["plmod", "plpkg"], memory="1Gi")(
        uses_project_code
    )()
