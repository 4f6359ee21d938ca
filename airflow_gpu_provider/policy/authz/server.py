"""The engine's ``authz`` plugin protocol, served on a unix socket: JSON over HTTP, the standard library only.

``POST /Plugin.Activate`` answers ``{"Implements": ["authz"]}``; ``POST /AuthZPlugin.AuthZReq`` gets each API call
(method, URI, headers, the body when the engine shows one, base64) and answers ``{"Allow": ..., "Msg": ...}``
(:func:`~.endpoints.decide`); ``POST /AuthZPlugin.AuthZRes`` allows every response. Anything that goes wrong while
judging is a refusal: the engine refuses the call.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import socketserver
import stat
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any

from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.authz.endpoints import Containers, Refused, decide

log = logging.getLogger("airflow_gpu_provider.authz")
MAX_REQUEST = 64 * 2**20  # the engine sends bodies under 1 MiB, base64 in JSON


class _Handler(BaseHTTPRequestHandler):
    server: AuthzServer
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        request: Any = {}
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_REQUEST:
                self.close_connection = True  # its body stays unread: a refusal, and no next request on it
            else:
                request = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            pass
        if not isinstance(request, dict):
            request = {}
        if self.path == "/Plugin.Activate":
            self._answer({"Implements": ["authz"]})
        elif self.path == "/AuthZPlugin.AuthZReq":
            self._answer(self.server.judge(request))
        elif self.path == "/AuthZPlugin.AuthZRes":
            self._answer({"Allow": True})
        else:
            self._answer({"Err": f"unknown plugin call {self.path}"}, status=404)

    def _answer(self, answer: Mapping[str, Any], status: int = 200) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.docker.plugins.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)


class AuthzServer(socketserver.ThreadingUnixStreamServer):
    """The plugin's server: one thread per engine connection (the engine may call it while it waits for the engine)."""

    daemon_threads = True

    def __init__(self, path: str) -> None:
        if os.path.lexists(path) and stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)  # a stale socket of an earlier run
        old = os.umask(0o077)  # the engine (root) connects; nobody else may
        try:
            super().__init__(path, _Handler)
        finally:
            os.umask(old)
        self.path = path
        self.policy: Policy | None = None
        self.containers: Containers | None = None

    def judge(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """One ``AuthZReq``: the verdict, logged when it is a refusal; an error refuses."""
        try:
            if self.policy is None or self.containers is None:
                raise RuntimeError("the plugin is not ready: its [gpu] policy is not read yet")
            allowed, why = decide(request, self.policy, self.containers)
        except Exception as err:  # whatever went wrong, the call is refused
            log.exception("Refused %s %s: the plugin failed", request.get("RequestMethod"), request.get("RequestUri"))
            return {"Allow": False, "Msg": f"the airflow-gpu authorization plugin failed: {err}"}
        if not allowed:
            log.warning("Refused %s", why)
        return {"Allow": allowed, "Msg": why}


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def engine_containers(engine_socket: str) -> Containers:
    """The engine's own answer about a container (``GET /containers/{id}/json``), for the decisions that need it."""

    def inspect(container_id: str) -> Mapping[str, Any] | None:
        connection = _UnixConnection(engine_socket)
        try:
            connection.request("GET", f"/containers/{container_id}/json")
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        if response.status == 404:
            return None
        if response.status != 200:
            raise Refused(f"the engine did not show container {container_id[:12]} ({response.status})")
        return dict(json.loads(data))

    return inspect
