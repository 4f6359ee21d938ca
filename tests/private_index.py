"""A private package index on this machine: PEP 503 "simple" pages behind HTTP basic auth, serving local wheels.

It answers 401 without the right credentials and records which credentials each request carried, so tests can show
that installs authenticate through the provider without the credentials ever showing up in a log or a command line.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class PrivateIndex:
    """A running index: ``url(host)`` with the credentials in it, and what the server saw."""

    port: int
    user: str
    password: str
    authorized: list[str] = field(default_factory=list)
    requests: int = 0
    delay: float = 0.0
    refused: list[str] = field(default_factory=list)

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{self.user}:{self.password}@{host}:{self.port}/simple"


@contextmanager
def private_index(
    wheels: Path, user: str = "alice", password: str = "s3cret-token", *, delay: float = 0.0
) -> Iterator[PrivateIndex]:
    """Serve ``wheels`` (a folder of ``*.whl``) on all interfaces, to ``user``/``password`` only.

    :param delay: seconds each answer waits (an install that takes its time: a worker killed meanwhile); the
        index's ``delay`` may be changed while it runs
    """
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self.do_GET(body=False)

        def do_GET(self, body: bool = True) -> None:
            index.requests += 1
            time.sleep(index.delay)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the installer may be gone meanwhile
                self._answer(body)

        def _answer(self, body: bool) -> None:
            if self.headers.get("Authorization") != expected:
                index.refused.append(self.path)
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="private"')
                self.end_headers()
                return
            index.authorized.append(self.path)
            parts = [p for p in self.path.split("?")[0].split("/") if p]
            if parts[:1] == ["simple"] and len(parts) == 2:
                name = parts[1].replace("-", "_").lower()
                links = "".join(
                    f'<a href="/files/{w.name}">{w.name}</a>'
                    for w in wheels.glob("*.whl")
                    if w.name.lower().startswith(name)
                )
                self._send(f"<html><body>{links}</body></html>".encode(), "text/html", body)
            elif parts[:1] == ["files"] and len(parts) == 2 and (wheels / parts[1]).is_file():
                self._send((wheels / parts[1]).read_bytes(), "application/octet-stream", body)
            else:
                self.send_response(404)
                self.end_headers()

        def _send(self, data: bytes, kind: str, body: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

    server = ThreadingHTTPServer(("0.0.0.0", 0), Handler)
    index = PrivateIndex(server.server_address[1], user, password, delay=delay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield index
    finally:
        server.shutdown()
        server.server_close()


def docker_host_address() -> str:
    """The address containers on Docker's default bridge reach this host at."""
    out = subprocess.run(
        ["docker", "network", "inspect", "bridge", "--format", "{{json .IPAM.Config}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    config = json.loads(out.stdout)[0]
    if config.get("Gateway"):
        return str(config["Gateway"])
    network = ipaddress.ip_network(config["Subnet"])
    return str(next(network.hosts()))  # the engine gives the bridge the subnet's first address
