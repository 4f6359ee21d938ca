"""The pod's containers: the stdlib runtime and the task's envelope, their commands and environment.

No ConfigMap and no image change: ``AIRFLOW_GPU_BOOTSTRAP`` holds the runtime's archive (``runtime.pyz``, zlib +
base64), ``AIRFLOW_GPU_ENVELOPE`` the task envelope (base64 JSON, read by the runtime as ``env:AIRFLOW_GPU_ENVELOPE``),
taken from the key ``envelope`` of the task's Secret (:func:`secret_manifest`, created and deleted with the pod by
:mod:`.companions`): the function's source and arguments, rendered from connections or params, are not in the pod
spec. The main container runs ``python3 -c <launcher> env:AIRFLOW_GPU_ENVELOPE /airflow/xcom/return.json``: the
launcher writes the archive to a file and runs it, and the runtime writes its result envelope where
KubernetesPodOperator's XCom sidecar reads it. The init container that installs requirements runs the same
launcher, as ``runtime.pyz install ...``.
"""

from __future__ import annotations

import base64
import functools
import json
import zlib
from collections.abc import Mapping
from typing import Any

from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.runtime.protocol import MODULES_ENV, RESULT_TO_LOG
from airflow_gpu_provider.settings import ResourceSettings
from airflow_gpu_provider.task.environment import (
    driver_environment,
    gpu_free_environment,
    thread_environment,
    with_user_environment,
)
from airflow_gpu_provider.task.runtime_zip import archive

BOOTSTRAP_ENV = "AIRFLOW_GPU_BOOTSTRAP"
ENVELOPE_ENV = "AIRFLOW_GPU_ENVELOPE"
SECRET_KEY = "envelope"  # noqa: S105 - the key of the task's Secret that holds the envelope, no password
RESULT_PATH = "/airflow/xcom/return.json"  # KubernetesPodOperator's XCom sidecar reads this file
# Writes the runtime's archive to a file, then runs it as __main__ (launched ranks run that file again), with the
# container's arguments: a task's envelope and result, or ``install ...`` in the init container.
LAUNCHER = (
    "import base64,os,runpy,tempfile,zlib;"
    "p=os.path.join(tempfile.gettempdir(),'airflow_gpu_runtime.pyz');"
    f"open(p,'wb').write(zlib.decompress(base64.b64decode(os.environ[{BOOTSTRAP_ENV!r}])));"
    "runpy.run_path(p,run_name='__main__')"
)
# Linux caps one environment string at 128 KiB (MAX_ARG_STRLEN); keep a margin for the name.
MAX_ENV_VALUE = 120 * 1024


@functools.cache
def bootstrap_payload() -> str:
    """The runtime's archive, compressed (once, as a whole: its members are stored) and base64-encoded."""
    return base64.b64encode(zlib.compress(archive(), 9)).decode()


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


def launch_command(*, result_to_log: bool = False) -> tuple[list[str], list[str]]:
    """``(command, args)`` of the main container.

    :param result_to_log: print the result as the last log line instead (a multi-node Job has no XCom sidecar)
    """
    return ["python3", "-c", LAUNCHER], [f"env:{ENVELOPE_ENV}", RESULT_TO_LOG if result_to_log else RESULT_PATH]


def secret_name(owner: str) -> str:
    """The name of the task's Secret: its pod's (or Job's), with ``-envelope`` (a DNS subdomain, like the pod's)."""
    return f"{owner[:240]}-{SECRET_KEY}"


def secret_manifest(name: str, namespace: str | None, labels: Mapping[str, str], envelope: str) -> dict[str, Any]:
    """The task's Secret, as the API's dict: immutable, its one key the envelope (:func:`encode_envelope`)."""
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if namespace:
        metadata["namespace"] = namespace
    data = {SECRET_KEY: base64.b64encode(envelope.encode()).decode()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "immutable": True, "data": data}


def envelope_variable(owner: str) -> dict[str, Any]:
    """The main container's ``AIRFLOW_GPU_ENVELOPE``: a reference to the key of the task's Secret, not its value."""
    return {"name": ENVELOPE_ENV, "valueFrom": {"secretKeyRef": {"name": secret_name(owner), "key": SECRET_KEY}}}


def task_environment(
    resources: ResourceSettings,
    environment: Mapping[str, str],
    processes: int = 1,
    modules_zip: str | None = None,
) -> dict[str, str]:
    """Environment of the main container: the task's over the provider's defaults (the envelope: its Secret's).

    Never over the provider's device isolation, nor over the runtime's variables.

    :param processes: the processes that share the pod's CPUs (a launch's ranks on this node)
    :param modules_zip: the project modules' archive (base64), in a variable of its own (:data:`MODULES_ENV`, which
        the envelope names): each variable has its own size limit
    """
    # a non-root user may have no home: caches go to /tmp
    provider = {"PYTHONUNBUFFERED": "1", "HOME": "/tmp", **thread_environment(resources, processes)}
    provider |= gpu_free_environment(resources) | driver_environment(resources)
    shipped = {MODULES_ENV: _fits(modules_zip, "The task's project modules (modules=)")} if modules_zip else {}
    return {
        **with_user_environment(provider, environment, resources.gpu_vendor),
        BOOTSTRAP_ENV: bootstrap_payload(),
        **shipped,
    }


def _fits(value: str, what: str) -> str:
    if len(value) > MAX_ENV_VALUE:
        raise GpuTaskError(
            f"{what} take {len(value) // 1024} KiB encoded, more than the {MAX_ENV_VALUE // 1024} KiB a pod's "
            "environment variable can hold. Bake larger code into the task's image (parent_image)."
        )
    return value
