"""The shipped function: compiled as if it were in its DAG file, called with its JSON arguments."""

from __future__ import annotations
import __future__

import linecache
import sys
import time
import types
from typing import Any

from .escalation import failed
from .output import say
from .protocol import ERROR, JSON_VALUES, PREFIX, function_tree, json_problem
from .signals import Terminated

MODULE = "__gpu_task__"  # the module the shipped function is defined in, importable as any module is


def load_function(envelope: dict[str, Any]) -> Any:
    """Define the shipped function in a module of its own, so that tracebacks show the DAG file's line numbers.

    The module is in ``sys.modules``, as a module is: a dataclass, an enum, a pydantic or attrs model defined in
    the function find it (``typing.get_type_hints``, ``dataclasses``, ``pickle`` look their module up there). The
    source is compiled with the DAG file's own ``from __future__ import annotations``, or without it
    (``annotations_future``; :func:`~.protocol.function_tree`).
    """
    filename = envelope.get("filename") or "<gpu task>"
    padded = "\n" * (int(envelope.get("first_line", 1)) - 1) + envelope["source"]
    linecache.cache[filename] = (len(padded), None, padded.splitlines(True), filename)
    future = bool(envelope.get("annotations_future"))
    tree = function_tree(padded, envelope["function"], annotations_future=future, filename=filename)
    flags = __future__.annotations.compiler_flag if future else 0
    code = compile(tree, filename, "exec", flags=flags, dont_inherit=True)
    module = types.ModuleType(MODULE)
    module.__file__ = filename
    sys.modules[MODULE] = module
    exec(code, module.__dict__)  # noqa: S102 - running the task's own function is the point
    return getattr(module, envelope["function"])


def call_function(envelope: dict[str, Any]) -> dict[str, Any]:
    """Call the shipped function; return the result envelope (without the cache report).

    Never raises, but for :class:`~.signals.Terminated` (SIGTERM), which ends the process.
    """
    started = time.monotonic()
    try:
        function = load_function(envelope)
        value = function(*envelope.get("args", []), **envelope.get("kwargs", {}))
    except Terminated:
        raise
    except SystemExit as exc:  # sys.exit() in user code: 0/None is success
        if exc.code not in (0, None):
            return failed(exc)
        value = None
    except Exception as exc:  # noqa: BLE001 - everything the user code raises is reported
        return failed(exc)
    problem = json_problem(value)  # NaN and infinity are not JSON either: XCom would refuse them later
    if problem is not None:
        return unsendable(envelope["function"], problem)
    return {"ok": True, "return_value": value, "duration_s": time.monotonic() - started}


def unsendable(function: str, problem: str) -> dict[str, Any]:
    """The result of a function whose return value cannot travel back as JSON: one line, the key, the fix.

    No traceback: the function returned, nothing raised.
    """
    message = (
        f"the return value of {function}() cannot travel back as JSON: {problem}. Return {JSON_VALUES} "
        "(a tensor or an array: .item() or .tolist(); a set: a list)"
    )
    say(f"{PREFIX} {message}", stderr=True)
    error = {"time": time.time(), "type": "TypeError", "kind": ERROR, "message": message, "traceback": ""}
    return {"ok": False, "error": error}
