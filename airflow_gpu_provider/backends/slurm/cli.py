"""A submit host's way to the cluster: Slurm's own commands, with munge (what ``sbatch`` on a login node does).

``sbatch --parsable`` submits; ``squeue --json`` answers for one job or, in one query, for all of this user's
(the trigger's batched look); ``scancel`` ends a job; ``sinfo --json`` lists the nodes. Each runs with an
environment of its own (``SLURM_CONF`` from the connection), never the worker's: ``sbatch --export=ALL`` hands the
job exactly the variables given here, so nothing of the worker (its Airflow settings, its secrets) reaches the job
or the controller's state. No shell.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

from airflow_gpu_provider.backends.slurm.connection import Cluster
from airflow_gpu_provider.backends.slurm.states import JobInfo, job_info
from airflow_gpu_provider.exceptions import GpuTaskError, GpuUnavailableError

TIMEOUT_S = 60.0
#: what sbatch says of a request that no node of the partition can ever satisfy
UNSATISFIABLE = ("Requested node configuration is not available", "Invalid generic resource", "Invalid feature")


class CliClient:
    """Slurm's commands on this submit host, for one cluster."""

    def __init__(self, facts: Cluster) -> None:
        self.facts = facts

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        keep = {k: os.environ[k] for k in ("HOME", "USER", "LOGNAME", "LANG", "TZ") if k in os.environ}
        conf = {"SLURM_CONF": self.facts.slurm_conf} if self.facts.slurm_conf else {}
        return {"PATH": os.environ.get("PATH", self.facts.path), **keep, **conf, **(extra or {})}

    def _run(self, argv: list[str], env: Mapping[str, str] | None = None) -> str:
        command = [shutil.which(argv[0]) or argv[0], *argv[1:]]  # found on the worker's PATH, not the job's
        try:
            done = subprocess.run(
                command, env=self._env(env), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
            )
        except FileNotFoundError:
            raise GpuTaskError(
                f"{argv[0]} is not on this worker's PATH: a worker that reaches Slurm as a submit host needs Slurm's "
                "commands and munge (or a connection with slurmrestd's URL): docs/slurm.md"
            ) from None
        if done.returncode != 0:
            message = done.stderr.strip() or done.stdout.strip()
            if any(text in message for text in UNSATISFIABLE):
                raise GpuUnavailableError(f"Slurm refused the job: {message}")
            raise GpuTaskError(f"{' '.join(argv[:2])} failed (exit {done.returncode}): {message}")
        return done.stdout

    def submit(self, script: str, directives: Mapping[str, str], environment: Mapping[str, str]) -> str:
        """``sbatch --parsable`` the script (a file on the shared folder); the job's id."""
        options = [f"--{name}={value}" if value else f"--{name}" for name, value in directives.items()]
        out = self._run(["sbatch", "--parsable", "--export=ALL", *options, script], env=environment)
        return out.strip().split(";")[0]

    def _squeue(self, *selection: str) -> list[dict[str, Any]]:
        return list(json.loads(self._run(["squeue", "--json", "--states=all", *selection]) or "{}").get("jobs", []))

    def job(self, job_id: str) -> JobInfo | None:
        """One job, or ``None`` when the controller no longer knows it (it ended more than ``MinJobAge`` ago)."""
        try:
            found = self._squeue(f"--jobs={job_id}")
        except GpuTaskError as err:
            if "Invalid job id" in str(err):
                return None
            raise
        return next((job_info(raw) for raw in found if str(raw.get("job_id")) == job_id), None)

    def jobs(self) -> dict[str, JobInfo]:
        """Every job of this user the controller knows: one query, whatever the number of tasks that look."""
        return {info.job_id: info for info in map(job_info, self._squeue("--me"))}

    def cancel(self, job_id: str) -> None:
        """``scancel``: SIGTERM to its steps, SIGKILL after the cluster's ``KillWait``."""
        self._run(["scancel", job_id])

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes (``sinfo --json``): names, states, partitions, GRES."""
        return list(json.loads(self._run(["sinfo", "--json"]) or "{}").get("nodes", []))

    def accounting(self, job_id: str) -> JobInfo | None:
        """A job the controller forgot, from ``sacct --json`` where the cluster keeps accounting; else ``None``."""
        try:
            found = json.loads(self._run(["sacct", "--json", f"--jobs={job_id}"]) or "{}").get("jobs", [])
        except (GpuTaskError, ValueError):
            return None  # no slurmdbd: sacct knows nothing
        for raw in found:
            if str(raw.get("job_id")) == job_id:
                state = raw.get("state") or {}
                exit_code = raw.get("exit_code") or {}
                status = exit_code.get("return_code") if isinstance(exit_code, dict) else None
                return JobInfo(
                    job_id,
                    str(state.get("current") if isinstance(state, dict) else state).upper(),
                    nodes=str(raw.get("nodes") or ""),
                    status=status if isinstance(status, int) else None,
                )
        return None
