"""The cluster's facts, from an Airflow connection of type ``slurm``: how to reach it, its shared folder, its GPUs.

A connection with a ``host`` reaches the cluster through slurmrestd: the host is its URL (``http://head:6820``),
the password a JWT (``scontrol token``), the login the token's user (by default the worker's). Without a host the
worker is a submit host and runs Slurm's commands (munge, and the extra's ``slurm_conf``, else Slurm's
default). The extra holds the rest, JSON::

    {"shared_dir": "/shared/airflow",       a folder every node and the worker mount at the same path (required)
     "accelerators": {"A100": "a100"},      accelerator model -> GRES type (several models: node features), or
                                            {"gres": "a100", "shards": 4}: each GPU also has 4 gres/shard of that
                                            type (a share of one GPU is a number of them)
     "python": "/opt/py/bin/python3",       the nodes' Python (default python3 on the job's PATH)
     "path": "/usr/local/bin:/usr/bin:/bin", the job's PATH (default: that one)
     "slurm_conf": "/etc/slurm/slurm.conf", a submit host's configuration of this cluster
     "api_version": "v0.0.38"}              slurmrestd's version to speak (default: the newest both know)

The token is read where it is used (the worker, the triggerer), never put in a trigger's arguments.
"""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_gpu_provider.exceptions import GpuTaskError

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class Cluster:
    """One cluster's facts (:func:`cluster`).

    :param name: the connection's id: where a job record says its job runs
    :param url: slurmrestd's URL (the REST path), or ``""`` (the CLI path)
    :param shards: accelerator model -> the gres/shard of one GPU of it (a share of a GPU is some of them)
    """

    name: str
    shared_dir: str
    url: str = ""
    token: str = field(default="", repr=False)
    user: str = ""
    slurm_conf: str = ""
    accelerators: Mapping[str, str] = field(default_factory=dict)
    python: str = "python3"
    path: str = DEFAULT_PATH
    api_version: str = ""
    shards: Mapping[str, int] = field(default_factory=dict)

    @property
    def rest(self) -> bool:
        """Whether it is reached through slurmrestd."""
        return bool(self.url)

    def gres_type(self, model: str) -> str | None:
        """The GRES type (and node feature) of an accelerator model, or ``None`` when the map has none."""
        return _of(self.accelerators, model)

    def shards_of(self, model: str) -> int | None:
        """How many ``gres/shard`` one GPU of ``model`` has, or ``None`` when the map gives it none."""
        return _of(self.shards, model)


def _of(mapping: Mapping[str, Any], model: str) -> Any:
    wanted = model.strip().upper()
    found = {key.strip().upper(): value for key, value in mapping.items()}
    return found.get(wanted) or found.get(wanted.split("-")[0])


def _accelerators(conn_id: str, value: Any) -> tuple[dict[str, str], dict[str, int]]:
    """The map's GRES types and shards per GPU (an entry is a GRES type, or ``{"gres": type, "shards": N}``)."""
    value = value or {}
    entries = list(value.items()) if isinstance(value, Mapping) else [("(the map)", value)]
    types, shards = {}, {}
    for model, entry in entries:
        kind, count = entry, 0
        if isinstance(entry, Mapping) and set(entry) <= {"gres", "shards"}:
            kind, count = entry.get("gres"), entry.get("shards", 0)
        if not isinstance(kind, str) or type(count) is not int or not 0 <= count <= 1024:
            raise GpuTaskError(
                f"The Slurm connection {conn_id!r}: 'accelerators' maps model names to a GRES type ('a100') or to "
                f'{{"gres": "a100", "shards": 4}} (4 gres/shard per GPU); {model!r} maps to {entry!r}.'
            )
        types[str(model)] = kind
        if count:
            shards[str(model)] = count
    return types, shards


def _extra(connection: Any) -> dict[str, Any]:
    extra = connection.extra_dejson
    return dict(extra if isinstance(extra, Mapping) else json.loads(extra or "{}"))


def cluster(conn_id: str) -> Cluster:
    """The facts of the connection ``conn_id`` (read from Airflow: a secrets backend, ``AIRFLOW_CONN_*``, the DB)."""
    from airflow.sdk import BaseHook

    try:
        connection = BaseHook.get_connection(conn_id)
    except Exception as err:  # noqa: BLE001 - Airflow's "not defined" differs between versions
        raise GpuTaskError(
            f"The Slurm connection {conn_id!r} cannot be read ({err}): define a connection of type 'slurm' whose "
            "extra names the cluster's shared_dir (docs/slurm.md)."
        ) from None
    extra = _extra(connection)
    shared = extra.get("shared_dir")
    if not isinstance(shared, str) or not os.path.isabs(shared):
        raise GpuTaskError(
            f"The Slurm connection {conn_id!r} has no shared_dir in its extra: an absolute folder that every node "
            "and the worker mount at the same path, where a job's files and its result are (docs/slurm.md)."
        )
    accelerators, shards = _accelerators(conn_id, extra.get("accelerators"))
    url = ""
    if connection.host:
        url = connection.host if "://" in connection.host else f"{connection.schema or 'http'}://{connection.host}"
        url = f"{url}:{connection.port}" if connection.port else url
    return Cluster(
        name=conn_id,
        shared_dir=os.path.normpath(shared),
        url=url.rstrip("/"),
        token=connection.password or "",
        user=connection.login or getpass.getuser(),
        slurm_conf=str(extra.get("slurm_conf") or ""),
        accelerators=accelerators,
        shards=shards,
        python=str(extra.get("python") or "python3"),
        path=str(extra.get("path") or DEFAULT_PATH),
        api_version=str(extra.get("api_version") or ""),
    )
