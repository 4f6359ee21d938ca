"""The stdlib-only runtime that runs inside child processes, containers and pods (see ``bootstrap.py``)."""

from __future__ import annotations

from pathlib import Path

BOOTSTRAP_PATH = Path(__file__).with_name("bootstrap.py")
"""The file that backends ship into the child process, container or pod and run with ``python3``."""
