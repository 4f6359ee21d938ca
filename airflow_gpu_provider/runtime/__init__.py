"""The stdlib-only runtime that runs inside child processes, containers and pods.

Shipped as one zip archive under the top-level name ``airflow_gpu_runtime`` (``task/runtime_zip.py`` builds it), so
its modules import only the standard library and each other, relatively. The contract with the worker, and the
only module the worker imports besides ``cuda.py``: ``protocol.py``.

A script the runtime starts finds the archive on its ``PYTHONPATH``: ``from airflow_gpu_runtime import resume``
(``resuming.py``; imported when first asked for, and without torch until it is called).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a job's subreaper imports this package, and typing costs milliseconds
if TYPE_CHECKING:
    from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("resume", "Resumed"):
        from . import resuming

        return getattr(resuming, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
