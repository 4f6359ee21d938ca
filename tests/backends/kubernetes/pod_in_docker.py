"""Run a rendered pod's containers in Docker, in the kubelet's order: init containers, then the main container.

This checks what the generated commands, arguments, environment, volumes and limits (memory and CPU, as the kubelet's
cgroup would apply them) do inside a real container with a real Python; it is *not* Kubernetes (no scheduler, no
device plugin, no XCom sidecar: the ``xcom`` emptyDir is read from the host afterwards, as the sidecar would read it).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.utils import parse_quantity

# this test process's own: parallel test workers and sessions on one engine never count each other's containers
LABEL = f"airflow-gpu-provider-test=pod-in-docker-{os.getpid()}"


def leftover_containers() -> list[str]:
    """Containers (any state) that these tests started."""
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={LABEL}"], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


@dataclass
class PodRun:
    """What the containers did."""

    exit_codes: dict[str, int]
    logs: dict[str, str]
    result: dict[str, Any] | None


def _docker_argv(
    container: dict[str, Any],
    volumes: dict[str, Path],
    shm: str | None,
    pod_security: dict[str, Any],
    *,
    name: str,
    labels: dict[str, str],
    secrets: dict[str, dict[str, str]],
) -> list[str]:
    argv = ["docker", "run", "--rm", "--name", name, "--label", LABEL, "--security-opt", "no-new-privileges"]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    security = {**pod_security, **(container.get("securityContext") or {})}  # as the kubelet applies them
    if "runAsUser" in security:
        argv += ["--user", f"{security['runAsUser']}:{security.get('runAsGroup', security['runAsUser'])}"]
    if "fsGroup" in pod_security:
        argv += ["--group-add", str(pod_security["fsGroup"])]
    for capability in (security.get("capabilities") or {}).get("drop") or []:
        argv += ["--cap-drop", capability]
    if shm:
        argv += ["--shm-size", str(int(parse_quantity(shm)))]
    limits = (container.get("resources") or {}).get("limits") or {}
    if "memory" in limits:  # as the kubelet's cgroup: no swap beyond the limit, the OOM killer at it
        memory = str(int(parse_quantity(limits["memory"])))
        argv += ["--memory", memory, "--memory-swap", memory]
    if "cpu" in limits:
        argv += ["--cpus", str(float(parse_quantity(limits["cpu"])))]
    for mount in container.get("volumeMounts") or []:
        if mount["mountPath"] == "/dev/shm":
            continue
        argv += ["-v", f"{volumes[mount['name']]}:{mount['mountPath']}" + (":ro" if mount.get("readOnly") else "")]
    for variable in container.get("env") or []:
        reference = (variable.get("valueFrom") or {}).get("secretKeyRef")  # as the kubelet reads a Secret's key
        value = secrets[reference["name"]][reference["key"]] if reference else variable["value"]
        argv += ["-e", f"{variable['name']}={value}"]
    command = container["command"]
    return [*argv, "--entrypoint", command[0], container["image"], *command[1:], *(container.get("args") or [])]


def run_pod(
    objects: list[dict[str, Any]],
    timeout: float = 300,
    secrets: dict[str, dict[str, str]] | None = None,
    *,
    labels: dict[str, str] | None = None,
    tmp: Path | None = None,
) -> PodRun:
    """Run the pod's init containers (stopping at the first failure) and its main container.

    Only this pod's containers are removed at the end: other runs may use the same engine.

    :param objects: what ``render_manifests()`` gives: the pod, and the task's Secret it reads its envelope from
    :param secrets: more Secrets the pod mounts, by name: key -> content
    :param labels: more labels for its containers (a run's own, to count what it left)
    :param tmp: where its volumes' folder goes (default: the system's temp folder)
    """
    [pod] = [obj for obj in objects if obj["kind"] == "Pod"]
    secrets = {**(secrets or {})}
    for secret in (obj for obj in objects if obj["kind"] == "Secret"):
        data = secret.get("data") or {}
        secrets[secret["metadata"]["name"]] = {key: base64.b64decode(value).decode() for key, value in data.items()}
    spec = pod["spec"]
    workdir = Path(tempfile.mkdtemp(prefix="pod-in-docker-", dir=tmp))
    names: list[str] = []
    try:
        volumes = {v["name"]: workdir / v["name"] for v in spec.get("volumes") or []}
        for path in volumes.values():
            path.mkdir()
            path.chmod(0o777)  # an emptyDir is writable by the pod's user, whoever that is
        for volume in spec.get("volumes") or []:
            if "secret" in volume:  # as the kubelet projects a Secret: one read-only file per item
                data = secrets[volume["secret"]["secretName"]]
                for item in volume["secret"]["items"]:
                    (volumes[volume["name"]] / item["path"]).write_text(data[item["key"]])
                    (volumes[volume["name"]] / item["path"]).chmod(0o444)
        shm = next((v["emptyDir"].get("sizeLimit") for v in spec.get("volumes") or [] if v["name"] == "dshm"), None)
        main = next(c for c in spec["containers"] if c["name"] == "base")
        exit_codes, logs = {}, {}
        for container in [*(spec.get("initContainers") or []), main]:
            names.append(f"pod-in-docker-{uuid.uuid4().hex[:10]}")
            argv = _docker_argv(
                container,
                volumes,
                shm,
                spec.get("securityContext") or {},
                name=names[-1],
                labels=labels or {},
                secrets=secrets,
            )
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            exit_codes[container["name"]] = done.returncode
            logs[container["name"]] = done.stdout + done.stderr
            if done.returncode != 0:
                break
        result_file = volumes.get("xcom", workdir / "none") / "return.json"
        result = json.loads(result_file.read_text()) if result_file.exists() else None
        return PodRun(exit_codes, logs, result)
    finally:
        if names:  # a timeout leaves its container running: only this pod's own are removed
            subprocess.run(["docker", "rm", "-f", *names], capture_output=True, check=False)
        shutil.rmtree(workdir, ignore_errors=True)
