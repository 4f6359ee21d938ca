"""Parse errors point at the DAG line: the DAG file, the line and the task, as the DAG's author wrote them.

Airflow keeps only the last frames of an import error (``[core] dagbag_import_error_traceback_depth``, 2 by
default), and they would be the provider's: the Dag Import Errors view would show ``gpu_step.py`` and
``resources.py``, never the user's file. So each entry point that a DAG file calls (the settings classes, the
operators' ``__init__`` and ``.partial()``, ``@task.gpu``) is wrapped by :func:`entry_point`. An
:class:`InvalidSettingError` leaving it

- starts with the caller's ``file:line`` and the task as written (``GpuStepOperator('train')``,
  ``@task.gpu('train')``; for settings built inside a task's call, that call, found in the DAG file's source); the
  line is the one that holds the mistake: the error's own ``source_line`` where the raiser knows it better (the line
  of a function that reads a module-level name, not the line that decorates or calls it);
- has a traceback whose last frame is that line of the DAG file, unless the line's source holds a credential (an
  index URL with a token): a traceback shows the source, and no credential reaches an import error (rule S1).

Airflow's own checks of a task's arguments (its ``.partial()`` / ``.expand()`` names, a decorated function's
binding) run before the provider's or not at all: the operators and the decorator check the same names first
(``operators/arguments.py``, ``task/call.py``), so those mistakes get a DAG line too. :func:`warn` puts a
deprecation warning at the DAG line, where Airflow's DagBag lists it among the file's warnings.

The caller is the first frame outside the provider and Airflow. Where that is the standard library (a
``dataclasses.replace`` of the provider's own, a deep copy), the error is left as it is: no DAG line caused it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_gpu_provider.exceptions import InvalidSettingError

if TYPE_CHECKING:
    import ast
    import types

F = TypeVar("F", bound=Callable[..., Any])

_PROVIDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")


def entry_point(owner: Callable[..., str | None] | None = None) -> Callable[[F], F]:
    """Decorate a function that DAG files call, so that its setting errors point at the DAG line.

    :param owner: called with the function's arguments: the task as written (``GpuStepOperator('train')``), or
        ``None`` to find it in the DAG file's source (settings built inside a task's call)
    """

    def wrap(function: F) -> F:
        @functools.wraps(function)
        def called(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except InvalidSettingError as err:
                frame = None if err.dag_line is not None else dag_frame(sys._getframe(1))
                if frame is None:
                    raise
                where = point_at(err, frame, owner(*args, **kwargs) if owner is not None else None)
                if _holds_a_credential(frame, where):
                    raise  # the message names the line; its source stays out of the traceback (rule S1)
                raise err.with_traceback(_ending_at(frame, where))  # noqa: B904 - the same error, at its line

        return called  # type: ignore[return-value]

    return wrap


@contextlib.contextmanager
def airflow_checks(owner: str, what: str) -> Iterator[None]:
    """Airflow's own checks of a task's arguments (``pool_slots=0``, ``.expand(x=5)``) as the task's parse error.

    Their ``TypeError`` or ``ValueError`` becomes an error of the task, which the entry point around puts at the DAG
    line.

    :param what: what Airflow checked, as the message shows it (``BaseOperator(...)``, ``expand()``)
    """
    try:
        yield
    except InvalidSettingError:
        raise
    except (TypeError, ValueError) as err:
        raise InvalidSettingError(owner, what, ..., f"Airflow refuses it: {err}") from err


def dag_frame(frame: types.FrameType | None) -> types.FrameType | None:
    """The first frame from ``frame`` outwards that is neither the provider's nor Airflow's: the DAG's line.

    ``None`` when that frame is the standard library's (the provider's own ``dataclasses.replace``) or there is none.
    """
    skipped = (_PROVIDER, *_airflow_folders())
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<") and not filename.startswith(skipped):  # <string>: a dataclass's __init__
            in_stdlib = filename.startswith(_stdlib_folders()) and "-packages" not in filename
            return None if in_stdlib else frame
        frame = frame.f_back
    return None


def point_at(err: InvalidSettingError, frame: types.FrameType, owner: str | None) -> tuple[str, int]:
    """Put the DAG's ``file:line`` and the task first in ``err``'s message; return that file and line.

    The line is the one that holds the mistake: the frame's, or the one the error knows (``source_line``: the line
    of a function that reads a name from outside it).
    """
    from airflow_gpu_provider.runtime.protocol import redact  # rule S1: no credential in an import error

    filename, line = err.source_line or (frame.f_code.co_filename, frame.f_lineno)
    task = owner or task_at(frame)
    message = str(err)
    named = f"{task}: " if task and not message.startswith(task) else ""
    err.dag_line = (filename, line)
    err.args = (redact(f"{filename}:{line}: {named}{message}"),)
    return err.dag_line


def task_at(frame: types.FrameType) -> str | None:
    """The task whose call holds the frame's current expression, as written: ``@task.gpu('train')``.

    From the source of the frame's file: the innermost call with a ``task_id=``, or a decorator call (the task id
    then defaults to the function's name). ``None`` outside any task (settings built at module level).
    """
    import ast
    import linecache

    positions = list(frame.f_code.co_positions())
    index = frame.f_lasti // 2
    if index >= len(positions) or None in positions[index]:
        return None
    line, end_line, column, end_column = positions[index]
    tree = _tree("".join(linecache.getlines(frame.f_code.co_filename, frame.f_globals)))
    if tree is None:
        return None
    found: tuple[tuple[int, int], str] | None = None

    def consider(call: ast.Call, default: str | None, prefix: str) -> None:
        nonlocal found
        if (call.lineno, call.col_offset) > (line, column) or (call.end_lineno, call.end_col_offset) < (
            end_line,
            end_column,
        ):
            return
        given = next((k.value for k in call.keywords if k.arg == "task_id"), None)
        task_id = repr(given.value) if isinstance(given, ast.Constant) else ast.unparse(given) if given else default
        start = (call.lineno, call.col_offset)
        if task_id is not None and (found is None or start > found[0]):  # the innermost call wins
            found = start, f"{prefix}{ast.unparse(call.func)}({task_id})"

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            consider(node, None, "")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call):
                    consider(decorator, repr(node.name), "@")
    return None if found is None else found[1]


@functools.lru_cache(maxsize=8)
def _tree(source: str) -> ast.Module | None:
    import ast

    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


@functools.cache
def _stdlib_folders() -> tuple[str, ...]:
    import sysconfig

    return tuple({os.path.join(sysconfig.get_paths()[key], "") for key in ("stdlib", "platstdlib")})


def warn(message: str, owner: str) -> None:
    """A deprecation warning at the DAG line that caused it (the first frame outside the provider and Airflow).

    :param owner: the task as written (``@task.gpu('train')``), put first in the message
    """
    import warnings

    from airflow.exceptions import AirflowProviderDeprecationWarning

    frame = dag_frame(sys._getframe(1))
    if frame is None:
        warnings.warn(f"{owner}: {message}", AirflowProviderDeprecationWarning, stacklevel=2)
        return
    filename, line = frame.f_code.co_filename, frame.f_lineno
    text = f"{owner}: {message}"  # where: the warning's own file and line (every view of a warning shows them)
    # at the DAG's line, from the provider: Airflow shows the deprecation warnings of airflow* modules (the filter
    # that configuration.py sets), and the DagBag keeps them as the file's warnings (the UI's DAG warnings)
    warnings.warn_explicit(text, AirflowProviderDeprecationWarning, filename, line, module=__name__)


def _holds_a_credential(frame: types.FrameType, where: tuple[str, int]) -> bool:
    """Whether the frame's current expression, or the line ``where``, holds a credential (a traceback shows them)."""
    import linecache

    from airflow_gpu_provider.runtime.protocol import redact

    first, last = frame.f_lineno, frame.f_lineno
    positions = list(frame.f_code.co_positions())
    if frame.f_lasti // 2 < len(positions):
        start, end = positions[frame.f_lasti // 2][:2]
        first, last = min(first, start or first), max(last, end or last)
    lines = [linecache.getline(frame.f_code.co_filename, number) for number in range(first, last + 1)]
    return any(redact(line) != line for line in [*lines, linecache.getline(*where)])


def _airflow_folders() -> tuple[str, ...]:
    airflow = sys.modules.get("airflow")
    return tuple(os.path.join(os.path.abspath(p), "") for p in getattr(airflow, "__path__", ()))


def _ending_at(frame: types.FrameType, where: tuple[str, int]) -> types.TracebackType:
    """A traceback of one entry, ``frame`` at its current line or at the line ``where`` of its file.

    Raised again, it stays the innermost entry. Another line of the frame's file has no instruction of its own:
    ``tb_lasti`` -1 makes ``traceback`` show ``tb_lineno``.
    """
    import types

    if where != (frame.f_code.co_filename, frame.f_lineno) and where[0] == frame.f_code.co_filename:
        return types.TracebackType(None, frame, -1, where[1])
    return types.TracebackType(None, frame, frame.f_lasti, frame.f_lineno)
