"""How the runtime's processes write their output: each line whole, a secondary rank's with its rank.

Several processes share the task's output (a launch's ranks, the copies of the task process that Lightning's
``ddp`` starts): a line another process writes in pieces (``print(..., end="", flush=True)``, a progress bar) must
not be cut by another's. So every runtime process writes only whole lines, whatever the task's code flushes
(:func:`whole_lines`: a line's start is held until it ends), a copy's output goes through a splitter that writes
every line whole, with its rank in front (:func:`split_output`), and a launch's launcher, which writes what its
ranks write (torch elastic's ``--tee``, each piece with :data:`~.protocol.RANK_PREFIX`), joins each rank's pieces
into whole lines before they meet another rank's (``by_rank``).
"""

from __future__ import annotations

import io
import os
import re
import sys
import threading
from typing import Any, TextIO

from .protocol import RANK_PREFIX

MAX_PENDING = 65536  # a line's start held longer than this is written as it is (a terminal would show it)
RANK_START = re.compile(re.escape(RANK_PREFIX).replace(re.escape("{rank}"), "[0-9]+"))

# Run as ``python -I -S -c SPLITTER PREFIX``: stdin is the rank's output, written to stdout line by line, prefixed
# (a ``\r`` ends a progress bar's update as ``\n`` ends a line); what is left at the end, as one more line.
SPLITTER = r"""
import os, re, sys
prefix, pending = sys.argv[1].encode(), b""
def write(data):
    while data:
        data = data[os.write(1, data):]
while True:
    data = os.read(0, 65536)
    pending += data
    *lines, pending = re.split(rb"(?<=[\r\n])", pending) if data else (pending + b"\n", b"")
    for line in lines:
        if line.strip(b"\r\n"):
            write(prefix + line)
    if not data:
        break
"""


def say(line: str, *, stderr: bool = False) -> None:
    """Write one line of the runtime's, in one call: whole, whoever else writes to the same output."""
    stream = sys.stderr if stderr else sys.stdout
    stream.write(f"{line}\n")
    stream.flush()


class WholeLines(io.TextIOBase):
    r"""A text stream that writes only whole lines (ended by ``\n`` or ``\r``) to ``stream``, each in one call.

    The start of a line is held until the line ends, whatever is flushed; what is left at the end goes with
    :meth:`finish`. With ``by_rank``, a write that starts with a rank's prefix continues that rank's line (its
    prefix dropped), not the line another rank began.
    """

    def __init__(self, stream: TextIO, *, by_rank: bool = False) -> None:
        super().__init__()
        self.stream, self.by_rank = stream, by_rank
        self._pending: dict[str, str] = {}  # the line each writer began: "" (this process), else a rank's prefix
        self._lock = threading.Lock()  # torch elastic writes each rank's lines from a thread of its own

    def write(self, text: str) -> int:  # noqa: D102 - io.TextIOBase's
        key = ""
        match = RANK_START.match(text) if self.by_rank else None
        with self._lock:
            if match is not None:
                key = match.group(0)
                pending = self._pending.pop(key, None)
                pending = text if pending is None else pending + text[len(key) :]
            else:
                pending = self._pending.pop(key, "") + text
            end = max(pending.rfind("\n"), pending.rfind("\r")) + 1
            if len(pending) - end > MAX_PENDING:
                end = len(pending)
            if end < len(pending):
                self._pending[key] = pending[end:]
            if end:
                self.stream.write(pending[:end])
                self.stream.flush()
        return len(text)

    def flush(self) -> None:  # noqa: D102 - the lines begun stay held
        self.stream.flush()

    def finish(self) -> None:
        """Write every line begun and not ended, each ended."""
        with self._lock:
            rest, self._pending = self._pending, {}
            for line in rest.values():
                self.stream.write(f"{line}\n")
            self.stream.flush()

    def writable(self) -> bool:  # noqa: D102
        return True

    def fileno(self) -> int:  # noqa: D102
        return self.stream.fileno()

    def isatty(self) -> bool:  # noqa: D102
        return self.stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]  # noqa: D102
        return self.stream.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]  # noqa: D102
        return self.stream.errors

    def __getattr__(self, name: str) -> Any:  # buffer, reconfigure, line_buffering, ...: the stream's
        return getattr(self.stream, name)


def whole_lines(*, by_rank: bool = False) -> None:
    """Have this process's ``sys.stdout`` and ``sys.stderr`` write whole lines only, each in one call.

    The task's own ``print`` included, in the task process and in each rank: a flush writes the lines ended so
    far, not the start of the next one; a line begun and not ended is written when the process exits.

    :param by_rank: this process writes the lines of several ranks, each with its prefix (a launcher)
    """
    import atexit

    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, WholeLines):
            continue
        reconfigure = getattr(stream, "reconfigure", None)  # None: a stream the task's environment replaced
        if reconfigure is not None:
            reconfigure(write_through=False)
        wrapped = WholeLines(stream, by_rank=by_rank)
        setattr(sys, name, wrapped)
        atexit.register(wrapped.finish)


def split_output(rank: int | str) -> None:
    """Send this process's output (file descriptors 1 and 2) through a splitter: each line whole, with its rank.

    The splitter is a process of its own, so that nothing written is lost when this one is killed: it writes what
    is left once every writer has closed the pipe (this process and what it started).
    """
    import subprocess

    prefix = RANK_PREFIX.format(rank=rank)
    shared = os.path.samestat(os.fstat(1), os.fstat(2))  # one pipe for both (a local child, a container's log)
    sys.stdout.flush()
    sys.stderr.flush()
    for fds in ((1, 2),) if shared else ((1,), (2,)):
        read, write = os.pipe()
        subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", SPLITTER, prefix], stdin=read, stdout=fds[0], close_fds=True
        )
        os.close(read)
        for fd in fds:
            os.dup2(write, fd)
        os.close(write)
