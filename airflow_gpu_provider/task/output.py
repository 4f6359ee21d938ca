r"""A task's output as log lines, for the local and Docker backends: bounded memory, progress bars streamed.

Output arrives in pieces that do not end at line ends. Lines end at ``\n``; a line longer than ``max_line`` bytes
is logged in pieces (one huge line never sits whole in the worker's memory); a ``\r``-only update (a tqdm progress
bar) is logged too, at most once a ``progress_interval``, and the last one before a real line end always is. The
credentials of every URL in a line are redacted (rule S1 of docs/security.md). A Python traceback in the output
(a script's, a command's) is logged as one record at ERROR (:class:`TaskLog`), the rest at INFO; the ranks of a
launch write whole lines, each with its rank first (``runtime/output.py``), so each rank's traceback is one record.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator

from airflow_gpu_provider.runtime.protocol import RANK_PREFIX, RESULT_MARKER, redact

MAX_LINE = 8192
PROGRESS_INTERVAL = 1.0
TRACEBACK = "Traceback (most recent call last):"
MAX_TRACEBACK_LINES = 400  # a longer one is logged in parts
RANK = re.compile(re.escape(RANK_PREFIX).replace(re.escape("{rank}"), "[0-9]+"))  # a rank's line starts so


class LineSplitter:
    """Feed it bytes as they come; it yields the lines to log."""

    def __init__(self, max_line: int = MAX_LINE, progress_interval: float = PROGRESS_INTERVAL) -> None:
        self.max_line, self.progress_interval = max_line, progress_interval
        self._pending = b""
        self._progress: bytes | None = None  # the latest \r update not logged yet
        self._progress_logged = float("-inf")

    def feed(self, data: bytes) -> Iterator[str]:
        """The lines ``data`` completes (or fills past ``max_line``)."""
        self._pending += data
        while True:
            end = min((i for i in (self._pending.find(b"\n"), self._pending.find(b"\r")) if i >= 0), default=-1)
            if end < 0:
                break
            line, separator, self._pending = self._pending[:end], self._pending[end : end + 1], self._pending[end + 1 :]
            if separator == b"\r":
                if line.strip():
                    yield from self._update(line[: self.max_line])
                continue
            if self._progress is not None:  # the bar's last state is always logged
                if line.strip():
                    yield _text(self._progress)
                else:
                    line = self._progress  # "...\r\n": the bar's final state ends the line
                self._progress = None
            yield from self._pieces(line)
        while len(self._pending) > self.max_line:
            piece, self._pending = self._pending[: self.max_line], self._pending[self.max_line :]
            yield _text(piece)

    def _pieces(self, line: bytes) -> Iterator[str]:
        for start in range(0, max(len(line), 1), self.max_line):
            yield _text(line[start : start + self.max_line])

    def _update(self, line: bytes) -> Iterator[str]:
        self._progress = line
        now = time.monotonic()
        if now - self._progress_logged >= self.progress_interval:
            self._progress_logged, self._progress = now, None
            yield _text(line)

    def flush(self) -> Iterator[str]:
        """What is left at the end of the output."""
        rest = self._pending if self._pending.strip() else self._progress
        self._pending, self._progress = b"", None
        if rest:
            yield _text(rest)


def _text(data: bytes) -> str:
    return redact(data.decode(errors="replace").rstrip())


def stream(read: Callable[[], bytes], emit: Callable[[str], object], splitter: LineSplitter | None = None) -> None:
    """Log everything ``read()`` returns until it returns ``b""``."""
    splitter = splitter or LineSplitter()
    while data := read():
        for line in splitter.feed(data):
            emit(line)
    for line in splitter.flush():
        emit(line)


class TaskLog:
    """Where a task's output lines go: a Python traceback as one ERROR record, the rest at INFO.

    The UI's error filter then shows the traceback. It ends at its first unindented line after the frames
    (``ValueError: boom``). The ranks of a launch write theirs at once, each line with its rank first: a traceback
    is one rank's lines.
    """

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._tracebacks: dict[str, list[str]] = {}  # by the rank that writes it ("" for the task process)

    def __call__(self, line: str) -> None:
        """Log one line, or hold it while its rank's traceback goes on."""
        rank = RANK.match(line)
        who, text = (rank.group(), line[rank.end() :]) if rank else ("", line)
        held = self._tracebacks.get(who)
        if held is None:
            if text.lstrip().startswith(TRACEBACK):
                self._tracebacks[who] = [line]
            else:
                self.log.info("%s", line)
            return
        held.append(line)
        ended = text[:1] not in (" ", "\t", "")  # the exception's own line, after the indented frames
        if ended or len(held) >= MAX_TRACEBACK_LINES:
            self.log.error("%s", "\n".join(self._tracebacks.pop(who)))

    def flush(self) -> None:
        """Log the tracebacks that the output ended in."""
        for held in self._tracebacks.values():
            self.log.error("%s", "\n".join(held))
        self._tracebacks.clear()


def log_output(read: Callable[[], bytes], log: logging.Logger) -> None:
    """Log a task's output (everything ``read()`` returns until ``b""``) as :class:`TaskLog` does."""
    task_log = TaskLog(log)
    stream(read, task_log)
    task_log.flush()


class ResultLines:
    r"""Takes the runtime's result lines (``\n[gpu] result: {...}\n``) out of an output stream; the rest passes on.

    The runtime prints its result envelope on its stdout (``runtime/protocol.py`` ``RESULT_TO_LOG``), after a line
    end of its own, so that output left without one (``printf foo``) never hides it. A line that starts with the
    marker is kept, not logged: the last whole one is :attr:`line` (the task's own code can print one too, which
    gains it nothing it could not return). Memory stays bounded: a result line longer than ``limit`` bytes is
    dropped as it comes, never held whole; while it is the last, :attr:`too_large` says so (:attr:`line`: ``None``).
    """

    def __init__(self, limit: int, marker: bytes = RESULT_MARKER.encode()) -> None:
        self.limit, self.marker = limit, marker
        self.line: bytes | None = None  # the last whole result line's JSON, as the runtime wrote it
        self.too_large = False
        self._mode = "start"  # at a line's start; "text": inside a line; "result": inside a result line; "skip"
        self._held = bytearray()  # at a line's start: what may begin the marker (an empty line first); a result

    def feed(self, data: bytes) -> bytes:
        """The bytes of ``data`` that are not result lines."""
        out, i = bytearray(), 0
        while i < len(data):
            if self._mode == "start":
                i = self._start(data, i, out)
            elif self._mode == "text":
                end = data.find(b"\n", i)
                out += data[i:] if end < 0 else data[i : end + 1]
                i, self._mode = (len(data), "text") if end < 0 else (end + 1, "start")
            else:
                end = data.find(b"\n", i)
                piece = data[i:] if end < 0 else data[i:end]
                if self._mode == "result" and len(self._held) + len(piece) > self.limit:
                    self._mode, self.too_large, self.line = "skip", True, None
                    self._held = bytearray()
                if self._mode == "result":
                    self._held += piece
                if end < 0:
                    break
                if self._mode == "result":
                    self.line, self.too_large = bytes(self._held), False
                self._mode, self._held, i = "start", bytearray(), end + 1
        return bytes(out)

    def _start(self, data: bytes, i: int, out: bytearray) -> int:
        """At a line's start: hold what may be an empty line and the marker; pass on what cannot be."""
        while i < len(data):
            byte = data[i : i + 1]
            blank = self._held[:1] == b"\n"
            got = len(self._held) - blank  # the marker's bytes seen so far
            if byte == self.marker[got : got + 1]:
                self._held += byte
                i += 1
                if got + 1 == len(self.marker):
                    self._mode, self._held = "result", bytearray()  # the empty line before it goes too
                    return i
            elif not self._held and byte == b"\n":
                self._held += byte  # an empty line: the runtime's own, before its result line?
                i += 1
            elif blank and got == 0:
                out += b"\n"  # an empty line after all; this byte starts the next line
                self._held = bytearray()
            else:
                out += self._held
                self._mode, self._held = "text", bytearray()
                return i
        return i

    def flush(self) -> bytes:
        """What was held at the end (a partial marker, an empty line): never a result (it has no line end)."""
        rest, self._held, self._mode = bytes(self._held) if self._mode == "start" else b"", bytearray(), "start"
        return rest
