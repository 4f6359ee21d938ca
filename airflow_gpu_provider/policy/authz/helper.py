"""The judge: a child of the root daemon that dropped root before it reads a request, and judges as the worker.

:func:`spawn` forks it from the daemon (no ``exec``: no window in which the worker's user could trace a fresh
process of its own). It takes every uid and gid of the workers' user at once (``setgroups``, ``setresgid``,
``setresuid``: the real, effective and saved ids alike, so no way back to root is left), and is no longer dumpable (the
kernel resets that flag when the ids change; it is set again explicitly): the workers' user can stop or kill it
(the daemon then refuses and forks another) but neither trace it nor read its memory. It judges as that user sees
the host: "the worker's own user" and the folders the worker may trust (rules D2, F1) mean what they mean on the
worker, and a folder the worker cannot reach cannot be judged safe.

It speaks one JSON line at a time on a socket pair: ``{"request": AuthZReq}`` in, ``{"lookup": [kind, name]}``
out when it needs the engine's view of something (the daemon asks the engine and answers ``{"answer": ...}``), then
``{"verdict": [allowed, why]}`` out.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.authz.judge import decide

PR_SET_DUMPABLE = 4


class Worker(SimpleNamespace):
    """Who the judge becomes: ``uid``, ``gid``, ``groups`` (the workers' user)."""

    uid: int
    gid: int
    groups: list[int]


def drop(worker: Worker) -> None:
    """Become the workers' user for good: every id, no supplementary group of root's, not dumpable."""
    if os.geteuid() == 0:
        os.setgroups(worker.groups)
        os.setresgid(worker.gid, worker.gid, worker.gid)
        os.setresuid(worker.uid, worker.uid, worker.uid)
        if os.getresuid() != (worker.uid,) * 3 or os.getresgid() != (worker.gid,) * 3:
            raise SystemExit("the judge could not drop root")
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def spawn(values: Mapping[str, Any], worker: Worker, keep: int) -> tuple[int, socket.socket]:
    """Fork a judge for the policy ``values``; its pid and the daemon's end of their socket pair.

    :param keep: the daemon's log descriptor (stderr), which the judge keeps; every other one it closes
    """
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid:
        theirs.close()
        return pid, ours
    try:  # the judge: nothing of the daemon's (its listening socket, the engine's connections) but the log
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        descriptor, start = theirs.detach(), 3
        for fd in sorted({descriptor, keep}):
            os.closerange(start, max(start, fd))
            start = max(start, fd + 1)
        os.closerange(start, os.sysconf("SC_OPEN_MAX"))
        drop(worker)
        serve(socket.socket(fileno=descriptor), values)
    finally:
        os._exit(0)


def serve(connection: socket.socket, values: Mapping[str, Any]) -> None:
    """Judge requests until the daemon closes the socket."""
    policy = Policy.of(SimpleNamespace(**values))
    stream = connection.makefile("rwb", buffering=0)
    for line in stream:
        request = json.loads(line).get("request") or {}
        try:
            allowed, why = decide(request, policy, lambda kind, name: _lookup(stream, kind, name))
        except Exception as err:  # noqa: BLE001 - whatever fails while judging, the call is refused
            allowed, why = False, f"the airflow-gpu authorization plugin failed while judging: {err!r}"
        _send(stream, {"verdict": [allowed, why]})


def _lookup(stream: Any, kind: str, name: str) -> Any:
    _send(stream, {"lookup": [kind, name]})
    answer = json.loads(stream.readline() or b"{}")
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return answer.get("answer")


def _send(stream: Any, message: Mapping[str, Any]) -> None:
    stream.write(json.dumps(message).encode() + b"\n")
