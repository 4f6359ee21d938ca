"""How the runtime's processes write their output: each line whole, a secondary rank's with its rank.

Several processes share the task's output (a launch's ranks, the copies of the task process that Lightning's
``ddp`` starts), and ``PYTHONUNBUFFERED`` has ``print`` write a line and its newline in two calls: another process's
line can come between them, and two lines glue together. So the runtime writes each of its lines in one call
(:func:`say`, also where it runs in the task's own processes: ``resume(accelerator)`` in a script), a runtime
process's streams write a line when it ends (:func:`whole_lines`), and a copy's output goes through a splitter that
writes every line whole, with its rank in front (:func:`split_output`). A launch's ranks get the same from their
launcher (torch elastic's ``--tee``: each rank's output read line by line, with :data:`~.protocol.RANK_PREFIX`;
``launchers/accelerate.py`` asks for it, ``launch.py`` gives it a folder).
"""

from __future__ import annotations

import os
import sys

from .protocol import RANK_PREFIX

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


def whole_lines() -> None:
    """Have this process's ``sys.stdout`` and ``sys.stderr`` write a line at its end, in one call.

    As on a terminal: a line is written when it ends (or on ``flush()``), not in pieces as ``PYTHONUNBUFFERED``
    writes it; the task's own ``print`` in the task process and in each rank included.
    """
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # None: a stream the task's environment replaced
        if reconfigure is not None:
            reconfigure(line_buffering=True, write_through=False)


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
