"""The main container's command and environment: the stdlib runtime shipped in environment variables.

No ConfigMap and no image change: ``AIRFLOW_GPU_BOOTSTRAP`` holds ``runtime/bootstrap.py`` (zlib + base64),
``AIRFLOW_GPU_ENVELOPE`` the task envelope (base64 JSON, read by the runtime as ``env:AIRFLOW_GPU_ENVELOPE``), and
the command is ``python3 -c <launcher> env:AIRFLOW_GPU_ENVELOPE /airflow/xcom/return.json``. The runtime writes
its result envelope where KubernetesPodOperator's XCom sidecar reads it.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import zlib
from collections.abc import Mapping
from typing import Any

from airflow_gpu_provider.backends.local import THREAD_VARIABLES
from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.runtime import BOOTSTRAP_PATH
from airflow_gpu_provider.settings import NVIDIA, ResourceSettings

BOOTSTRAP_ENV = "AIRFLOW_GPU_BOOTSTRAP"
ENVELOPE_ENV = "AIRFLOW_GPU_ENVELOPE"
RESULT_PATH = "/airflow/xcom/return.json"  # KubernetesPodOperator's XCom sidecar reads this file
# Writes the runtime to a file and runs it as __main__: launched ranks (accelerate) run that file again.
LAUNCHER = (
    "import base64,os,runpy,tempfile,zlib;"
    "p=os.path.join(tempfile.gettempdir(),'airflow_gpu_bootstrap.py');"
    f"open(p,'wb').write(zlib.decompress(base64.b64decode(os.environ[{BOOTSTRAP_ENV!r}])));"
    "runpy.run_path(p,run_name='__main__')"
)
# Linux caps one environment string at 128 KiB (MAX_ARG_STRLEN); keep a margin for the name.
MAX_ENV_VALUE = 120 * 1024
SECURITY_DEFAULTS: dict[str, Any] = {"privileged": False, "allowPrivilegeEscalation": False}


@functools.cache
def bootstrap_payload() -> str:
    """``runtime/bootstrap.py``, compressed and base64-encoded for an environment variable."""
    return base64.b64encode(zlib.compress(BOOTSTRAP_PATH.read_bytes(), 9)).decode()


def encode_envelope(envelope: Mapping[str, Any]) -> str:
    """The envelope as base64 JSON; too large for an environment variable is an error that says what to do."""
    value = base64.b64encode(json.dumps(envelope).encode()).decode()
    if len(value) > MAX_ENV_VALUE:
        raise GpuTaskError(
            f"The task's code and arguments take {len(value) // 1024} KiB encoded, more than the "
            f"{MAX_ENV_VALUE // 1024} KiB a pod's environment variable can hold. Pass large data by reference "
            "(a path or URL to object storage) instead of as an argument."
        )
    return value


def launch_command() -> tuple[list[str], list[str]]:
    """``(command, args)`` of the main container."""
    return ["python3", "-c", LAUNCHER], [f"env:{ENVELOPE_ENV}", RESULT_PATH]


def task_environment(
    resources: ResourceSettings, environment: Mapping[str, str], envelope: Mapping[str, Any]
) -> dict[str, str]:
    """Environment of the main container, the runtime's two variables last (they win)."""
    result = {"PYTHONUNBUFFERED": "1"}
    if resources.cpu_count is not None:
        threads = str(max(1, math.ceil(resources.cpu_count)))
        result.update(dict.fromkeys(THREAD_VARIABLES, threads))
    if not resources.requests_gpus and resources.gpu_vendor == NVIDIA:
        # CUDA images set NVIDIA_VISIBLE_DEVICES=all; on nodes whose default runtime is nvidia that would hand
        # every GPU of the node to a pod that asked for none. "void" keeps the container GPU-free.
        result["NVIDIA_VISIBLE_DEVICES"] = "void"
    result.update(environment)
    result[BOOTSTRAP_ENV] = bootstrap_payload()
    result[ENVELOPE_ENV] = encode_envelope(envelope)
    return result


def security_context(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Not privileged, no privilege escalation; ``container_security_context`` keys replace the defaults."""
    return {**SECURITY_DEFAULTS, **overrides}
