"""The calls docker-py writes, as the engine shows them to its authorization plugin, without an engine.

:func:`written` runs docker-py's ``APIClient`` against a transport that records each request and answers it, and
:func:`engine_view` turns a request into the ``AuthZReq`` the engine sends (the header map with each header's last
value, the body only when its first ``Content-Type`` is JSON, never ``X-Registry-Auth``). :func:`lookup` stands for the
engine's answers about what it has.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import requests

import docker

DATA = Path(__file__).resolve().parents[1] / "data" / "docker"
ID = "c" * 64


class _Recorder(requests.adapters.BaseAdapter):
    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.sent: list[requests.PreparedRequest] = []
        self.answer = answer

    def send(self, request: requests.PreparedRequest, **_: Any) -> requests.Response:
        self.sent.append(request)
        response = requests.Response()
        response.status_code, response.request = 200, request
        response._content = json.dumps(self.answer).encode()
        response.headers["Content-Type"] = "application/json"
        response.url = str(request.url)
        return response

    def close(self) -> None:
        pass


def written(call: Callable[[Any], Any], answer: Any = None) -> list[dict[str, Any]]:
    """The ``AuthZReq`` of each request docker-py writes for ``call(client)`` (answered ``answer``)."""
    client = docker.APIClient(base_url="unix:///nowhere.sock", version="1.41")
    recorder = _Recorder({"Id": ID} if answer is None else answer)
    client.mount("http+docker://", recorder)
    call(client)
    return [engine_view(request) for request in recorder.sent]


def engine_view(request: requests.PreparedRequest) -> dict[str, Any]:
    """What the engine shows its plugin of ``request``."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "x-registry-auth")}
    body = request.body.encode() if isinstance(request.body, str) else request.body
    shown = body if isinstance(body, bytes) and body and headers.get("Content-Type") == "application/json" else None
    return {
        "RequestMethod": request.method,
        "RequestUri": request.path_url,
        "RequestHeaders": headers,
        "RequestBody": base64.b64encode(shown).decode() if shown else None,
    }


def raw(method: str, uri: str, body: bytes | None = None, **headers: str) -> dict[str, Any]:
    """An ``AuthZReq`` as given: the header map, the body shown as given."""
    return {
        "RequestMethod": method,
        "RequestUri": uri,
        "RequestHeaders": {k.replace("_", "-"): v for k, v in headers.items()},
        "RequestBody": base64.b64encode(body).decode() if body else None,
    }


def stored_container(**changes: Any) -> dict[str, Any]:
    """A provider's container as the engine stores it (recorded from Debian's docker.io 20.10), with ``changes`` to
    its ``HostConfig`` (``Config`` under ``Config``)."""
    found = json.loads((DATA / "provider_container.json").read_text())["container"]
    config = changes.pop("Config", {})
    return {**found, "Config": {**found["Config"], **config}, "HostConfig": {**found["HostConfig"], **changes}}


def lookup(things: Mapping[tuple[str, str], Any]) -> Callable[[str, str], Any]:
    """The engine's answers: ``things[(kind, name)]``, ``None`` for anything it does not have; ``info`` recorded."""
    info = json.loads((DATA / "provider_container.json").read_text())["info"]
    return lambda kind, name: info if kind == "info" else things.get((kind, name))
