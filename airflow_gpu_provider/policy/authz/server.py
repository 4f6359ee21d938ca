"""The root daemon: the engine's ``authz`` protocol on a unix socket, every judgement handed to the judge.

The engine POSTs JSON over HTTP/1.1: ``/Plugin.Activate`` (answered ``{"Implements": ["authz"]}``),
``/AuthZPlugin.AuthZReq`` for each API call (``{"Allow": ..., "Msg": ...}``) and ``/AuthZPlugin.AuthZRes`` (every
response is allowed). One event loop, no thread: the daemon stays root only to keep its socket (0600, root's) and
to fork the judge (``helper.py``), which judges as the workers' user. A judgement the judge does not give within
``timeout`` seconds (the judge stopped or killed by that user) is a refusal, and a new judge is forked.

The judge asks the engine what it has (a container, an image, a volume, the engine's defaults); the daemon asks
the engine (``GET`` only, on paths of its own making), with a token of its own in a header, and allows its own
calls when the engine asks about them. Anything that goes wrong while judging is a refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import signal
import socket
import stat
from collections.abc import Mapping
from typing import Any

from airflow_gpu_provider.policy.authz.calls import FULL_ID, IMAGE
from airflow_gpu_provider.policy.authz.helper import Worker, spawn

log = logging.getLogger("airflow_gpu_provider.authz")
MAX_REQUEST = 64 * 2**20  # the engine sends bodies under 1 MiB, base64 in JSON
TOKEN_HEADER = "X-Airflow-Gpu-Authz"  # noqa: S105 - the header's name; its value is made at each start
LOOKUPS = {  # what the judge may have the daemon ask the engine: kind -> (name's form, path)
    "container": (FULL_ID, "/v1.41/containers/{}/json"),
    "image": (IMAGE, "/v1.41/images/{}/json"),
    "volume": (r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}", "/v1.41/volumes/{}"),
    "info": ("", "/v1.41/info"),
}


class Daemon:
    """The plugin's daemon: its socket, the engine it asks, the judge it forks."""

    def __init__(self, values: Mapping[str, Any], worker: Worker, engine: str, *, timeout: float = 5.0) -> None:
        self.values, self.worker, self.engine, self.timeout = dict(values), worker, engine, timeout
        self.token = secrets.token_hex(16)
        self.judge: tuple[int, asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.lock = asyncio.Lock()
        self.info: dict[str, Any] | None = None
        self.verdicts = {"allowed": 0, "refused": 0, "stalled": 0}

    async def serve(self, path: str, ready: asyncio.Event | None = None) -> None:
        """Listen on ``path`` (made 0600) until cancelled; the socket is removed on the way out."""
        if os.path.lexists(path) and stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)  # a stale socket of an earlier run
        old = os.umask(0o077)  # the engine (root) connects; nobody else may
        try:
            server = await asyncio.start_unix_server(self._connection, path, limit=MAX_REQUEST)
        finally:
            os.umask(old)
        try:
            await self._fork()
            if ready is not None:
                ready.set()
            async with server:
                await server.serve_forever()
        finally:
            self._kill()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    async def _fork(self) -> None:
        pid, connection = spawn(self.values, self.worker, keep=2)
        reader, writer = await asyncio.open_connection(sock=connection, limit=MAX_REQUEST)
        self.judge = (pid, reader, writer)
        log.info("judge %d judges as uid %d gid %d", pid, self.worker.uid, self.worker.gid)

    def _kill(self) -> None:
        if self.judge is None:
            return
        pid, _, writer = self.judge
        self.judge = None
        writer.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection of the engine's: requests one after the other (keep-alive), until it closes."""
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *fields = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
                if "transfer-encoding" in headers or int(headers.get("content-length") or 0) > MAX_REQUEST:
                    return  # not what the engine sends: the connection ends
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                status, answer = await self._answer(line.split(" ")[1] if " " in line else "", body)
                data = json.dumps(answer).encode()
                writer.write(f"HTTP/1.1 {status} OK\r\nContent-Type: application/vnd.docker.plugins.v1+json\r\n"
                             f"Content-Length: {len(data)}\r\n\r\n".encode() + data)  # fmt: skip
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    async def _answer(self, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        if path == "/Plugin.Activate":
            return 200, {"Implements": ["authz"]}
        if path == "/AuthZPlugin.AuthZRes":
            return 200, {"Allow": True}
        if path != "/AuthZPlugin.AuthZReq":
            return 404, {"Err": f"unknown plugin call {path}"}
        try:
            request = json.loads(body or b"{}")
            if not isinstance(request, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            return 200, {"Allow": False, "Msg": f"the airflow-gpu authorization plugin cannot read the call: {err}"}
        if self._own(request):
            return 200, {"Allow": True}
        allowed, why = await self.decide(request)
        self.verdicts["allowed" if allowed else "refused"] += 1
        if not allowed:
            log.warning("Refused %s", why)
        return 200, {"Allow": allowed, "Msg": why}

    def _own(self, request: Mapping[str, Any]) -> bool:
        """The daemon's own question to the engine (its token, ``GET``, one of its paths)."""
        headers = {str(k).lower(): str(v) for k, v in (request.get("RequestHeaders") or {}).items()}
        if not secrets.compare_digest(headers.get(TOKEN_HEADER.lower(), ""), self.token):
            return False
        uri = str(request.get("RequestUri") or "")
        return request.get("RequestMethod") == "GET" and any(
            re.fullmatch(re.escape(path).replace(r"\{\}", form or ""), uri) for form, path in LOOKUPS.values()
        )

    async def decide(self, request: Mapping[str, Any]) -> tuple[bool, str]:
        """The judge's verdict on one call, or a refusal when it has none within the timeout."""
        shown = f"{request.get('RequestMethod')} {str(request.get('RequestUri') or '').partition('?')[0]}"
        async with self.lock:
            try:
                return await asyncio.wait_for(self._ask(request), self.timeout)
            except (TimeoutError, asyncio.TimeoutError, ConnectionError, ValueError, OSError) as err:
                self.verdicts["stalled"] += 1
                log.error("The judge gave no verdict on %s (%r): refused, and a new judge is forked", shown, err)
                self._kill()
                await self._fork()
                return False, f"{shown}: the airflow-gpu authorization plugin's judge gave no verdict in time"

    async def _ask(self, request: Mapping[str, Any]) -> tuple[bool, str]:
        assert self.judge is not None
        _, reader, writer = self.judge
        writer.write(json.dumps({"request": request}).encode() + b"\n")
        while True:
            await writer.drain()
            line = await reader.readline()
            if not line:
                raise ConnectionError("the judge is gone")
            message = json.loads(line)
            if "verdict" in message:
                allowed, why = message["verdict"]
                return bool(allowed), str(why)
            kind, name = message["lookup"]
            try:
                reply: dict[str, Any] = {"answer": await self.lookup(str(kind), str(name))}
            except (OSError, ValueError) as err:
                reply = {"error": f"the engine did not answer: {err}"}
            writer.write(json.dumps(reply).encode() + b"\n")

    async def lookup(self, kind: str, name: str) -> Any:
        """The engine's inspect of a ``container``, ``image`` or ``volume`` (``None``: there is none), or ``info``.

        :raises ValueError: for a kind or a name not of its form
        """
        if kind not in LOOKUPS or not re.fullmatch(LOOKUPS[kind][0], name):
            raise ValueError(f"no lookup {kind} {name!r}")
        if kind == "info" and self.info is not None:
            return self.info
        status, data = await self._get(LOOKUPS[kind][1].format(name))
        if status == 404:
            return None
        if status != 200:
            raise ValueError(f"{kind} {name!r}: the engine answered {status}")
        found = json.loads(data)
        if kind == "info":
            self.info = found
        return found

    async def _get(self, path: str) -> tuple[int, bytes]:
        reader, writer = await asyncio.open_unix_connection(self.engine, limit=MAX_REQUEST)
        try:
            writer.write(f"GET {path} HTTP/1.0\r\nHost: docker\r\n{TOKEN_HEADER}: {self.token}\r\n\r\n".encode())
            await writer.drain()
            response = await reader.read()
        finally:
            writer.close()
        head, _, data = response.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), data


def worker_of(user: str) -> Worker:
    """The workers' user: a name, a uid or ``uid:gid`` (a name's groups from the host's group database)."""
    import grp
    import pwd

    name, _, group = user.partition(":")
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        if not name.isdigit():
            raise SystemExit(f"--user {user!r}: no such user on this host") from None
        uid, gid = int(name), int(group or name)
        return Worker(uid=uid, gid=gid, groups=[gid])
    gid = int(group) if group.isdigit() else (grp.getgrnam(group).gr_gid if group else entry.pw_gid)
    return Worker(uid=entry.pw_uid, gid=gid, groups=os.getgrouplist(entry.pw_name, gid))


def connect(path: str, timeout: float = 10.0) -> socket.socket:
    """A connection to a unix socket (the plugin's, for ``--check``)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(timeout)
    connection.connect(path)
    return connection
