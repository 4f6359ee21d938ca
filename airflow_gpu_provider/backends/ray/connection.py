"""Reaching a Ray cluster's Jobs API: the address and the client's settings, from a connection or the options.

A connection of type ``ray`` holds what the Apache Ray provider's ``RayHook`` reads from it: the extra's ``address``
(the dashboard's URL, ``http://head:8265``), ``headers``, ``cookies`` (JSON objects) and ``verify``; a connection
with a host instead is ``http://host:port`` (8265 without a port). Headers and cookies (tokens, often) stay in the
connection: the trigger of a deferred task gets the connection's id and reads them again in the triggerer.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.exceptions import GpuTaskError

if TYPE_CHECKING:
    from airflow_gpu_provider.backends.ray.options import RayOptions

DEFAULT_CONN_ID = "ray_default"
DASHBOARD_PORT = 8265


def _json(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    return dict(json.loads(value)) if value else {}


def _connection(conn_id: str, *, required: bool) -> Any:
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(conn_id)
    except Exception as err:  # noqa: BLE001 - Airflow's "not defined" differs between versions
        if required:
            raise GpuTaskError(f"The Ray connection {conn_id!r} cannot be read: {err}") from None
        return None


def client_settings(conn_id: str | None, address: str | None) -> tuple[str, dict[str, Any]]:
    """The Jobs API's address and ``JobSubmissionClient`` keyword arguments.

    ``address`` (``backend_options``), else the connection ``conn_id``, else ``ray_default`` when it exists, else
    ``$RAY_ADDRESS`` (as the ``ray`` CLI).
    """
    if address:
        return address, {}
    connection = _connection(conn_id or DEFAULT_CONN_ID, required=conn_id is not None)
    if connection is None:
        found = os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS")
        if not found:
            raise GpuTaskError(
                "No Ray cluster named: set backend_options={'ray_conn_id': ...} (a connection of type 'ray' whose "
                "extra has the dashboard's 'address') or {'address': 'http://ray-head:8265'} (docs/ray.md)."
            )
        return found, {}
    extra = _json(connection.extra_dejson)
    found = extra.get("address") or extra.get("extra__ray__address")
    if not found and connection.host:
        scheme = connection.schema or ("http" if "://" not in connection.host else "")
        host = connection.host if not scheme else f"{scheme}://{connection.host}"
        found = f"{host}:{connection.port or DASHBOARD_PORT}"
    if not found:
        raise GpuTaskError(f"The Ray connection {connection.conn_id!r} has no address (its extra's 'address').")
    settings: dict[str, Any] = {"headers": _json(extra.get("headers")), "cookies": _json(extra.get("cookies"))}
    if "verify" in extra:
        verify = extra["verify"]
        settings["verify"] = verify if isinstance(verify, bool) else str(verify).lower() not in ("false", "0")
    return str(found), settings


def job_client(conn_id: str | None, address: str | None) -> Any:
    """A ``JobSubmissionClient`` for the cluster (imports ``ray``: only when a Ray task runs)."""
    from ray.job_submission import JobSubmissionClient

    found, settings = client_settings(conn_id, address)
    return JobSubmissionClient(found, **settings)


def options_client(options: RayOptions) -> tuple[Any, str]:
    """The client for a task's options, and the address it reaches."""
    found, settings = client_settings(options.ray_conn_id, options.address)
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(found, **settings), found
