"""The shipped function: compiled as if it were in its DAG file, called with its JSON arguments."""

from __future__ import annotations
import __future__

import json
import linecache
import time
from typing import Any

from .escalation import failed
from .signals import Terminated


def load_function(envelope: dict[str, Any]) -> Any:
    """Compile the shipped source so that tracebacks show the DAG file's own line numbers."""
    filename = envelope.get("filename") or "<gpu task>"
    padded = "\n" * (int(envelope.get("first_line", 1)) - 1) + envelope["source"]
    linecache.cache[filename] = (len(padded), None, padded.splitlines(True), filename)
    code = compile(padded, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace: dict[str, Any] = {"__name__": "__gpu_task__", "__file__": filename}
    exec(code, namespace)  # noqa: S102 - running the task's own function is the point
    return namespace[envelope["function"]]


def call_function(envelope: dict[str, Any]) -> dict[str, Any]:
    """Call the shipped function; return the result envelope (without the cache report).

    Never raises, but for :class:`~.signals.Terminated` (SIGTERM), which ends the process.
    """
    started = time.monotonic()
    try:
        function = load_function(envelope)
        value = function(*envelope.get("args", []), **envelope.get("kwargs", {}))
        try:
            json.dumps(value, allow_nan=False)  # NaN and infinity are not JSON: XCom would refuse them later
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"the return value of {envelope['function']}() is a {type(value).__name__}, which cannot travel "
                f"back as JSON ({exc}); return None, bool, int, float (finite), str, or lists/dicts of those"
            ) from exc
    except Terminated:
        raise
    except SystemExit as exc:  # sys.exit() in user code: 0/None is success
        if exc.code not in (0, None):
            return failed(exc)
        value = None
    except Exception as exc:  # noqa: BLE001 - everything the user code raises is reported
        return failed(exc)
    return {"ok": True, "return_value": value, "duration_s": time.monotonic() - started}
