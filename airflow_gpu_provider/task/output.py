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

from airflow_gpu_provider.runtime.protocol import RANK_PREFIX, redact

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
