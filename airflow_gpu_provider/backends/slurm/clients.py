"""The cluster's client, as its connection says: slurmrestd's (``rest.py``) or a submit host's commands (``cli.py``).

Both answer the same calls: ``submit``, ``job``, ``jobs`` (one query for all of the user's), ``cancel``, ``nodes``
and ``accounting``, with the same job records (``states.JobInfo``).
"""

from __future__ import annotations

from typing import Any

from airflow_gpu_provider.backends.slurm.connection import Cluster, cluster


def client(facts: Cluster) -> Any:
    """The client of a cluster's facts."""
    if facts.rest:
        from airflow_gpu_provider.backends.slurm.rest import RestClient

        return RestClient(facts)
    from airflow_gpu_provider.backends.slurm.cli import CliClient

    return CliClient(facts)


def connect(conn_id: str) -> Any:
    """The client of the connection ``conn_id`` (read again wherever it is called: the worker, the triggerer)."""
    return client(cluster(conn_id))
