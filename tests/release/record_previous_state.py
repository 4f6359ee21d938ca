"""What the previous release (b5efba0) writes where it outlives it: tests/release/previous_release_state.json.

Run with that release's code (the venv tests/release/test_upgrade.py builds), outside this checkout::

    cd /tmp && PREVIOUS_VENV/bin/python REPO/tests/release/record_previous_state.py > REPO/tests/release/...json
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import airflow_gpu_provider
from airflow_gpu_provider.backends.docker.trigger import DockerContainerTrigger
from airflow_gpu_provider.backends.ray.trigger import RayJobTrigger
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.host.trigger import GpuFreeTrigger, GpuStartTrigger
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

DEADLINE, SINCE = 1767229200.0, 1767225600.0


def record() -> dict[str, Any]:
    """The trigger rows, a Docker deferral's state and a result envelope, as this code writes them."""
    engine = {"docker_url": "unix://var/run/docker.sock", "version": "auto", "timeout": 60}
    state = {"container": "c" * 64, "since": SINCE}
    triggers = [
        DockerContainerTrigger("c" * 64, engine, 1.0, DEADLINE, state=state, stop_timeout=2.0),
        RayJobTrigger("airflow-gpu-d-train-1", {"address": "http://127.0.0.1:8265"}, 2.0, DEADLINE, SINCE, state={}),
        GpuFreeTrigger(["/var/lib/airflow-gpu/locks/gpu-0.lock"], 1, DEADLINE, requested="1x nvidia GPU", since=SINCE),
        GpuStartTrigger(ResourceSettings(gpu_count=1, memory="8Gi").to_dict(), 3600.0),
    ]
    conf = GpuConfig.read(state_dir="/var/lib/airflow-gpu", kill_grace=7.0)
    labels = {"dag_id": "d", "task_id": "train", "run_id": "manual__1", "try_number": "1", "map_index": "-1"}
    request = TaskRequest(
        ResourceSettings(gpu_count=1, memory="8Gi"), ImageSettings(), Envelope.run(["python3", "-c", "print(1)"]),
        "fail", labels, durable=True,
    )  # fmt: skip
    skipped = {"status": "skipped", "reason": "torch is not loaded", "freed_bytes": 0}
    return {
        "recorded_by": f"airflow-gpu-provider {airflow_gpu_provider.__version__} at b5efba0 ({__file__.rsplit('/')[-1]})",
        "triggers": {trigger.serialize()[0]: trigger.serialize()[1] for trigger in triggers},
        "deferral": {
            "phase": "run",
            "backend": state,
            "try": {"conf": dataclasses.asdict(conf), "request": request.to_state()},
        },
        "result": {"ok": True, "return_value": {"runs": 1}, "duration_s": 60.1, "cache": [skipped, skipped]},
    }


if __name__ == "__main__":
    print(json.dumps(json.loads(json.dumps(record())), indent=1))
