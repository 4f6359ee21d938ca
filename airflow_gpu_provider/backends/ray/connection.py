"""Reaching a Ray cluster's Jobs API: the address, its token and the client's settings, checked before any request.

A connection of type ``ray`` holds what the Apache Ray provider's ``RayHook`` reads from it: the extra's ``address``
(the dashboard's URL, ``http://head:8265``), ``headers``, ``cookies`` (JSON objects) and ``verify``; a connection
with a host instead is ``http://host:port`` (8265 without a port). Its **password is the cluster's token** (Ray's
token auth, 2.52+), sent as ``Authorization: Bearer``. An ``address`` option, or ``$RAY_ADDRESS`` without a
connection, takes the token where Ray's own CLI finds it: ``$RAY_AUTH_TOKEN``, the file ``$RAY_AUTH_TOKEN_PATH``
names, ``~/.ray/auth_token``. The token stays in the connection or the process: a deferred task's trigger gets the
connection's id and reads it again in the triggerer.

Before the first request (:func:`endpoint`), on the worker, in the triggerer and in the listener: the address must
be allowed (``clusters.py``, rule R1), a token must be at hand, and the cluster must refuse a request without it;
only a cluster the admin lists as ``ray-unauthenticated=`` is used without.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_gpu_provider.backends.ray.clusters import RayClusters, address_key
from airflow_gpu_provider.exceptions import GpuTaskError

DEFAULT_CONN_ID = "ray_default"
DASHBOARD_PORT = 8265
_AUTHENTICATED: set[str] = set()  # the addresses seen refusing a request without the token (this process)


def _json(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    return dict(json.loads(value)) if value else {}


def read_connection(conn_id: str, *, required: bool) -> Any:
    """The Airflow connection ``conn_id``; ``None`` when it is not required and cannot be read."""
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(conn_id)
    except Exception as err:  # noqa: BLE001 - Airflow's "not defined" differs between versions
        if required:
            raise GpuTaskError(f"The Ray connection {conn_id!r} cannot be read: {err}") from None
        return None


def connection_address(connection: Any) -> str:
    """The Jobs API's address a connection names (its extra's ``address``, else ``http://host:port``)."""
    extra = _json(connection.extra_dejson)
    found = extra.get("address") or extra.get("extra__ray__address")
    if not found and connection.host:
        scheme = connection.schema or ("http" if "://" not in connection.host else "")
        host = connection.host if not scheme else f"{scheme}://{connection.host}"
        found = f"{host}:{connection.port or DASHBOARD_PORT}"
    if not found:
        raise GpuTaskError(f"The Ray connection {connection.conn_id!r} has no address (its extra's 'address').")
    return str(found).rstrip("/")


def default_address() -> str | None:
    """The address of the deployment's own cluster: the ``ray_default`` connection's, or ``None`` without one."""
    found = read_connection(DEFAULT_CONN_ID, required=False)
    return None if found is None else connection_address(found)


def check_cluster(owner: str, field: str, address: str, clusters: RayClusters | None = None) -> None:
    """Rule R1 for one address: listed, or ``ray_default``'s (read only when the address is not listed).

    :raises PolicyError: naming the address and ``allowed_clusters``
    """
    clusters = clusters or RayClusters.current()
    if address_key(address) not in clusters.listed:
        clusters.check(owner, field, address, default_address())


def ray_cli_token() -> str:
    """The token where Ray's own CLI finds it: ``$RAY_AUTH_TOKEN``, ``$RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _with_token(settings: dict[str, Any], token: str) -> dict[str, Any]:
    headers = {str(k): v for k, v in settings.get("headers", {}).items()}
    if token and not any(k.lower() in ("authorization", "x-ray-authorization") for k in headers):
        from airflow.sdk.log import mask_secret

        mask_secret(token)
        headers["Authorization"] = f"Bearer {token}"
    return {**settings, "headers": headers}


def _authenticates(settings: dict[str, Any]) -> bool:
    headers = {k.lower() for k in settings.get("headers", {})}
    return bool(headers & {"authorization", "x-ray-authorization"}) or "ray-authentication-token" in settings.get(
        "cookies", {}
    )


def client_settings(conn_id: str | None, address: str | None) -> tuple[str, dict[str, Any]]:
    """The Jobs API's address and ``JobSubmissionClient`` keyword arguments, the token in its headers.

    ``address`` (``backend_options``), else the connection ``conn_id``, else ``ray_default`` when it exists, else
    ``$RAY_ADDRESS`` (as the ``ray`` CLI). Nothing is checked here: :func:`endpoint` does.
    """
    if address:
        return address, _with_token({}, ray_cli_token())
    connection = read_connection(conn_id or DEFAULT_CONN_ID, required=conn_id is not None)
    if connection is None:
        found = os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS")
        if not found:
            raise GpuTaskError(
                "No Ray cluster named: set backend_options={'ray_conn_id': ...} (a connection of type 'ray' whose "
                "extra has the dashboard's 'address') or {'address': 'http://ray-head:8265'} (docs/ray.md)."
            )
        return found, _with_token({}, ray_cli_token())
    extra = _json(connection.extra_dejson)
    settings: dict[str, Any] = {"headers": _json(extra.get("headers")), "cookies": _json(extra.get("cookies"))}
    if "verify" in extra:
        verify = extra["verify"]
        settings["verify"] = verify if isinstance(verify, bool) else str(verify).lower() not in ("false", "0")
    return connection_address(connection), _with_token(settings, connection.password or "")


def enforces_token(address: str, verify: Any = True) -> bool:
    """Whether the cluster refuses a request that carries no token (401 or 403 to ``GET /api/version``)."""
    import requests

    try:
        answer = requests.get(f"{address}/api/version", timeout=15, verify=verify)
    except requests.RequestException as err:
        raise GpuTaskError(f"The Ray cluster {address} cannot be reached: {err}") from None
    return answer.status_code in (401, 403)


@dataclass(frozen=True)
class Endpoint:
    """A cluster the task may reach, with what reaches it: the Jobs API's and the state API's clients."""

    address: str
    settings: dict[str, Any] = field(default_factory=dict)

    def jobs(self) -> Any:
        """A ``JobSubmissionClient`` (imports ``ray``: only when a Ray task runs)."""
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.address, **self.settings)

    def state(self) -> Any:
        """Ray's state API client, with the same headers and cookies."""
        from ray.util.state.api import StateApiClient

        headers = {"Content-Type": "application/json", **self.settings.get("headers", {})}
        return StateApiClient(self.address, cookies=self.settings.get("cookies"), headers=headers)


def endpoint(conn_id: str | None, address: str | None, *, owner: str = "The Ray task") -> Endpoint:
    """The cluster ``conn_id`` or ``address`` names, once the policy allows it (rule R1); no job is touched.

    :raises PolicyError: an address the deployment does not list
    :raises GpuTaskError: no token, or a cluster that answers without one, unless listed ``ray-unauthenticated``
    """
    found, settings = client_settings(conn_id, address)
    clusters = RayClusters.current()
    field_name = "backend_options['address']" if address else f"the Ray connection {conn_id or DEFAULT_CONN_ID!r}"
    check_cluster(owner, field_name, found, clusters)
    if clusters.without_token(found):
        return Endpoint(found, settings)
    opt_in = f"the admin lists it as ray-unauthenticated={found} in [gpu_policy] allowed_clusters (docs/security.md)"
    if not _authenticates(settings):
        raise GpuTaskError(
            f"No token for the Ray cluster {found}: put the cluster's token (Ray token auth) in the password of "
            f"the Ray connection (docs/ray.md). A cluster without token auth is used only where {opt_in}."
        )
    if address_key(found) not in _AUTHENTICATED and not enforces_token(found, settings.get("verify", True)):
        raise GpuTaskError(
            f"The Ray cluster {found} accepts requests without a token: whoever reaches it runs code on its nodes "
            f"and reads every job. Start it with token auth (docs/ray.md), or accept that only where {opt_in}."
        )
    _AUTHENTICATED.add(address_key(found))
    return Endpoint(found, settings)
