"""A worker that is no submit host reaches the cluster through slurmrestd, with a JWT from the connection.

The versions of Slurm's REST API differ in their fields and newer Slurm drops old ones, so the client speaks none
by assumption: it asks the daemon what it serves (its OpenAPI document, ``/openapi/v3``) and speaks the newest
version both know (:data:`SUPPORTED`, each tested against Slurm 22.05's slurmrestd), or the connection's
``api_version`` when it pins one; a daemon that serves none of them is refused, naming what it serves and what is
supported. Directives map to the job's JSON properties (:data:`PROPERTIES`).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from airflow_gpu_provider.backends.slurm.connection import Cluster
from airflow_gpu_provider.backends.slurm.states import JobInfo, job_info
from airflow_gpu_provider.exceptions import GpuTaskError, GpuUnavailableError

#: the REST API versions this provider speaks, newest first (Slurm 22.05 serves v0.0.36 to v0.0.38)
SUPPORTED = ("v0.0.38", "v0.0.37")
TIMEOUT_S = 30.0
GRACE_S = 10.0  # between SIGTERM and SIGKILL when a job is cancelled (scancel's is the cluster's KillWait)
_VERSION = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/job/submit$")
#: sbatch's long options -> the job's JSON property, and how its value is written
PROPERTIES: dict[str, tuple[str, Any]] = {
    "job-name": ("name", str),
    "partition": ("partition", str),
    "account": ("account", str),
    "qos": ("qos", str),
    "reservation": ("reservation", str),
    "gres": ("gres", str),
    "constraint": ("constraints", str),
    "exclude": ("exclude_nodes", str),
    "mem": ("memory_per_node", lambda value: int(value.rstrip("M"))),
    "cpus-per-task": ("cpus_per_task", int),
    "time": ("time_limit", int),
    "nodes": ("nodes", lambda value: [int(value), int(value)]),
    "ntasks-per-node": ("tasks_per_node", int),
    "comment": ("comment", str),
    "output": ("standard_output", str),
    "open-mode": ("open_mode", str),
    "chdir": ("current_working_directory", str),
    "requeue": ("requeue", lambda _: True),
    "no-requeue": ("requeue", lambda _: False),
}


def version(served: list[str], pinned: str = "") -> str:
    """The version to speak: ``pinned`` when the daemon serves it and it is supported, else the newest of both."""
    if pinned:
        if pinned not in SUPPORTED or pinned not in served:
            raise GpuTaskError(
                f"The Slurm connection pins api_version {pinned!r}: slurmrestd serves {', '.join(served) or 'none'}, "
                f"this provider supports {', '.join(SUPPORTED)}."
            )
        return pinned
    for candidate in SUPPORTED:
        if candidate in served:
            return candidate
    raise GpuTaskError(
        f"slurmrestd serves the REST API versions {', '.join(served) or '(none found in /openapi/v3)'}; this provider "
        f"supports {', '.join(SUPPORTED)} (Slurm 22.05). Reach the cluster as a submit host, or ask for support."
    )


def properties(directives: Mapping[str, str], environment: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The job's JSON properties of sbatch directives, and the directives that have none (they are dropped)."""
    job: dict[str, Any] = {"environment": dict(environment)}
    dropped = []
    for name, value in directives.items():
        if name not in PROPERTIES:
            dropped.append(name)
            continue
        key, write = PROPERTIES[name]
        job[key] = write(value)
    return job, dropped


class RestClient:
    """slurmrestd, for one cluster: the version it speaks is found on the first call."""

    def __init__(self, facts: Cluster) -> None:
        self.facts = facts
        self._version = ""

    def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        headers = {"X-SLURM-USER-TOKEN": self.facts.token, "Content-Type": "application/json"}
        if self.facts.user:
            headers["X-SLURM-USER-NAME"] = self.facts.user
        data = None if body is None else json.dumps(body).encode()
        url = f"{self.facts.url}{path}"
        if not url.startswith(("http://", "https://")):
            raise GpuTaskError(f"The Slurm connection's host {self.facts.url!r} is not an http(s) URL")
        request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310 - checked
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310 - the admin's URL
                return dict(json.loads(response.read() or b"{}"))
        except urllib.error.HTTPError as err:
            try:
                answer = dict(json.loads(err.read() or b"{}"))
            except ValueError:
                answer = {}
            if answer.get("errors") is not None:
                return {**answer, "status": err.code}
            raise GpuTaskError(f"slurmrestd at {self.facts.url} answered {method} {path} with {err.code}") from None
        except OSError as err:
            raise GpuTaskError(f"slurmrestd at {self.facts.url} cannot be reached: {err}") from None

    @property
    def version(self) -> str:
        """The REST API version spoken (asked of the daemon once)."""
        if not self._version:
            paths = self._call("GET", "/openapi/v3").get("paths") or {}
            served = sorted({m.group(1) for p in paths if (m := _VERSION.match(p))}, reverse=True)
            self._version = version(served, self.facts.api_version)
        return self._version

    def _errors(self, answer: Mapping[str, Any]) -> str:
        found = [e.get("description") or e.get("error") for e in answer.get("errors") or [] if isinstance(e, dict)]
        return "; ".join(str(text) for text in found if text)

    def submit(self, script: str, directives: Mapping[str, str], environment: Mapping[str, str]) -> str:
        """``POST .../job/submit`` with the script's text; the job's id."""
        with open(script, encoding="utf-8") as handle:
            text = handle.read()
        job, _ = properties(directives, environment)
        answer = self._call("POST", f"/slurm/{self.version}/job/submit", {"script": text, "job": job})
        if "job_id" not in answer:
            message = self._errors(answer)
            if "Requested node configuration is not available" in message:
                raise GpuUnavailableError(f"Slurm refused the job: {message}")
            raise GpuTaskError(f"slurmrestd refused the job: {message or answer}")
        return str(answer["job_id"])

    def job(self, job_id: str) -> JobInfo | None:
        """One job, or ``None`` when the controller no longer knows it."""
        answer = self._call("GET", f"/slurm/{self.version}/job/{job_id}")
        found = [job_info(raw) for raw in answer.get("jobs") or []]
        return next((info for info in found if info.job_id == job_id), None)

    def jobs(self) -> dict[str, JobInfo]:
        """Every job the controller knows, in one query (the token's user sees what Slurm shows it)."""
        answer = self._call("GET", f"/slurm/{self.version}/jobs")
        return {info.job_id: info for info in map(job_info, answer.get("jobs") or [])}

    def cancel(self, job_id: str) -> None:
        """SIGTERM to the job (``DELETE ...?signal=TERM``), SIGKILL (the API's cancel) once :data:`GRACE_S` passed."""
        import time

        self._call("DELETE", f"/slurm/{self.version}/job/{job_id}?signal=TERM")
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info is None or not info.active:
                return
            time.sleep(0.5)
        self._call("DELETE", f"/slurm/{self.version}/job/{job_id}")

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes."""
        return list(self._call("GET", f"/slurm/{self.version}/nodes").get("nodes") or [])

    def accounting(self, job_id: str) -> JobInfo | None:
        """Slurmrestd's accounting (``slurmdb/``) needs slurmdbd and plugins of its own: not asked here."""
        return None
