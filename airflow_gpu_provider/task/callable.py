"""What a task runs: a callable's source and its JSON arguments, or a command, checked when the DAG is parsed.

The function's **source** is shipped, not its module: it must import what it needs inside its body. That is checked
when the DAG is parsed (:func:`shipped_callable`), so a ``NameError`` never waits for a GPU to surface. Its
arguments: :mod:`.call`.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import functools
import inspect
import linecache
import os
import shlex
import symtable
import textwrap
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from types import CodeType
from typing import Any

from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.runtime.protocol import function_tree


def _iso(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


# Context values a shipped function may receive by naming a parameter after them (all JSON).
CONTEXT_VALUES: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "params": lambda ctx: dict(ctx.get("params") or {}),
    "run_id": lambda ctx: ctx.get("run_id"),
    "ds": lambda ctx: ctx.get("ds"),
    "ds_nodash": lambda ctx: ctx.get("ds_nodash"),
    "ts": lambda ctx: ctx.get("ts"),
    "ts_nodash": lambda ctx: ctx.get("ts_nodash"),
    "logical_date": lambda ctx: _iso(ctx.get("logical_date")),
    "data_interval_start": lambda ctx: _iso(ctx.get("data_interval_start")),
    "data_interval_end": lambda ctx: _iso(ctx.get("data_interval_end")),
    "try_number": lambda ctx: getattr(ctx.get("ti"), "try_number", None),
    "task_instance_key_str": lambda ctx: ctx.get("task_instance_key_str"),
}


class ShippedCallable:
    """A function reduced to what the runtime needs to rebuild it (and its signature, for the worker's checks).

    Its source (decorators removed), the line of its ``def`` and its file are read from the DAG file when first
    asked for: when the task starts, or at parse where a check needs the source.
    """

    __slots__ = ("_code", "_text", "annotations_future", "context_params", "name", "signature")

    def __init__(
        self,
        function: Callable[..., Any],
        context_params: tuple[str, ...],
        signature: inspect.Signature,
        annotations_future: bool,
        text: tuple[str, int, str] | None = None,
    ) -> None:
        # its code, not the function: the cache of shipped functions is keyed weakly by the function
        self._code, self.name, self.context_params = function.__code__, function.__name__, context_params
        self.signature, self.annotations_future, self._text = signature, annotations_future, text

    def _read(self) -> tuple[str, int, str]:
        if self._text is None:
            _, source, first_line = _function_source(self._code, f"python_callable {self.name!r}")
            self._text = source, first_line, inspect.getsourcefile(self._code) or "<gpu task>"
        return self._text

    @property
    def source(self) -> str:
        """The function's source, decorators removed and dedented."""
        return self._read()[0]

    @property
    def first_line(self) -> int:
        """The line of its ``def`` in its file."""
        return self._read()[1]

    @property
    def filename(self) -> str:
        """Its file."""
        return self._read()[2]


@functools.cache
def known_context_keys() -> frozenset[str]:
    """The keys of Airflow's task context (a parameter of that name is filled in when the task runs)."""
    from airflow.sdk.definitions.context import Context

    return frozenset(Context.__annotations__)  # KNOWN_CONTEXT_KEYS from Airflow 3.1, the same keys


def _global_reads(source: str, name: str, annotations_future: bool) -> set[str]:
    """Names the function reads from module (or builtin) scope: what no scope of its own binds.

    Scope-aware (``symtable``): a nested function's parameter or a comprehension variable binds the name there only.
    Defaults are evaluated where the function is defined, so their names count; the annotations of its own
    signature are not evaluated, those in its body are unless the DAG file defers them, as the runtime compiles it
    (:func:`~airflow_gpu_provider.runtime.protocol.function_tree`).
    """
    if annotations_future:
        source = "from __future__ import annotations\n" + source
    else:
        source = ast.unparse(function_tree(source, name, annotations_future=False))
    module = symtable.symtable(source, "<gpu task>", "exec")
    reads = {s.get_name() for s in module.get_symbols() if s.is_referenced()}  # defaults
    pending = [t for t in module.get_children() if t.get_name() == name]
    while pending:
        table = pending.pop()
        reads |= {s.get_name() for s in table.get_symbols() if s.is_referenced() and s.is_global()}
        pending.extend(table.get_children())
    return reads


def _names(function: Callable[..., Any]) -> set[str] | None:
    """Every name the function's compiled code (nested code included) loads, stores or takes an attribute of.

    A superset of what :func:`_global_reads` finds in its body; ``None`` for a closure (it reads from outside).
    """
    code = function.__code__
    if code.co_freevars:
        return None
    names: set[str] = set()
    pending = [code]
    while pending:
        current = pending.pop()
        names.update(current.co_names)
        pending.extend(c for c in current.co_consts if isinstance(c, type(code)))
    return names


_PARSING = threading.Lock()


@functools.lru_cache(maxsize=32)
def _file_functions(filename: str, mtime_ns: int) -> dict[int, ast.FunctionDef]:
    """Every function of a source file by its first line (decorators included), parsed once per file."""
    with _PARSING:  # CPython 3.11's AST conversion is not thread-safe (gh-106905): tasks of threads parse at once
        tree = ast.parse("".join(linecache.getlines(filename)), filename)
    return {
        (node.decorator_list[0].lineno if node.decorator_list else node.lineno): node
        for node in _statements(tree.body)
        if isinstance(node, ast.FunctionDef)
    }


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement in ``body``, nested ones too: a ``def`` is a statement, so expressions need no visit."""
    for node in body:
        yield node
        for name in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(node, name, None) or [])
        for part in getattr(node, "handlers", None) or getattr(node, "cases", None) or []:
            yield from _statements(part.body)


def _function_source(function: Callable[..., Any] | CodeType, owner: str) -> tuple[ast.FunctionDef, str, int]:
    """A function's (or its code's) AST node, its source without decorators (dedented), the line of its ``def``."""
    code = function if isinstance(function, CodeType) else function.__code__
    filename = inspect.getsourcefile(code)
    node = None
    if filename is not None:
        try:
            linecache.checkcache(filename)
            node = _file_functions(filename, os.stat(filename).st_mtime_ns)[code.co_firstlineno]
        except (OSError, SyntaxError, KeyError):
            node = None
    if filename is not None and node is not None and node.name == code.co_name:
        lines = linecache.getlines(filename)[node.lineno - 1 : node.end_lineno]
        return node, textwrap.dedent("".join(lines)), node.lineno
    try:  # not in a file we could parse (e.g. defined interactively), or it changed since: ask inspect
        lines, start = inspect.getsourcelines(code)
        text = textwrap.dedent("".join(lines))
        with _PARSING:
            parsed = ast.parse(text).body[0]
        if not isinstance(parsed, ast.FunctionDef) or parsed.name != code.co_name:
            raise OSError(f"{filename}:{code.co_firstlineno} holds other code: the file changed since it was loaded")
    except (OSError, TypeError, SyntaxError, IndexError) as err:
        raise InvalidSettingError(
            owner,
            "python_callable",
            code.co_name,
            f"its source is not available ({err})",
            "a function defined in a file",
        ) from None
    body = "\n".join(text.splitlines()[parsed.lineno - 1 : parsed.end_lineno]) + "\n"
    return parsed, body, start + parsed.lineno - 1


_SHIPPED: weakref.WeakKeyDictionary[Callable[..., Any], ShippedCallable] = weakref.WeakKeyDictionary()


def shipped_callable(function: Callable[..., Any], *, owner: str) -> ShippedCallable:
    """Extract a function's source (decorators removed) and check that it can run on its own.

    Once per function: the decorator checks it where the function is decorated, and its operator reuses that.

    :raises InvalidSettingError: for lambdas, async functions, bound methods, or functions that read
        module-level names or closure variables, which do not travel with the source (the error names the line
        that reads the first of them).
    """
    known = _SHIPPED.get(function) if inspect.isfunction(function) else None
    if known is not None:
        return known
    name = getattr(function, "__name__", repr(function))
    accepted = "a module-level or nested 'def' function that imports what it uses inside its body"
    if not inspect.isfunction(function) or name == "<lambda>":
        raise InvalidSettingError(owner, "python_callable", function, "only plain functions can be shipped", accepted)
    if inspect.iscoroutinefunction(function):
        raise InvalidSettingError(owner, "python_callable", name, "async functions are not supported", accepted)
    future = bool(function.__code__.co_flags & __future__.annotations.compiler_flag)
    names, text = _names(function), None
    # A function without defaults (evaluated outside it) that names nothing of its module and is no closure reads
    # nothing from outside: its source waits until the task starts (a parse does not need it)
    if names is None or function.__defaults__ or function.__kwdefaults__ or not names.isdisjoint(function.__globals__) \
            or not linecache.getlines(function.__code__.co_filename):  # fmt: skip
        node, source, first_line = _function_source(function, owner)
        text = source, first_line, inspect.getsourcefile(function) or "<gpu task>"
        _refuse_outside_names(function, owner, names, node, text)
    signature = inspect.signature(function)
    context_keys = known_context_keys()
    context_params = tuple(p for p in signature.parameters if p in context_keys)
    unsupported = [p for p in context_params if p not in CONTEXT_VALUES]
    if unsupported:
        raise InvalidSettingError(
            owner,
            "python_callable",
            name,
            f"parameter(s) {', '.join(map(repr, unsupported))} ask for Airflow context objects, which cannot "
            "leave the worker",
            f"context values that travel as JSON: {', '.join(sorted(CONTEXT_VALUES))}",
        )
    shipped = _SHIPPED[function] = ShippedCallable(function, context_params, signature, future, text)
    return shipped


def _refuse_outside_names(
    function: Callable[..., Any],
    owner: str,
    names: set[str] | None,
    node: ast.FunctionDef,
    text: tuple[str, int, str],
) -> None:
    """Refuse a function that reads names from outside it (its module's, a closure's), naming the first such line.

    :param names: what its code names (:func:`_names`); its defaults' names are added from ``node``
    """
    defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
    if names is not None and names.union(
        n.id for d in defaults for n in ast.walk(d) if isinstance(n, ast.Name)
    ).isdisjoint(function.__globals__):
        return  # nothing it names is its module's: no scope analysis needed
    source, first_line, filename = text
    future = bool(function.__code__.co_flags & __future__.annotations.compiler_flag)
    free = _global_reads(source, node.name, future) - set(dir(builtins))
    outside = sorted(n for n in free if n in function.__globals__ or n in function.__code__.co_freevars)
    if outside:
        err = InvalidSettingError(
            owner,
            "python_callable",
            function.__name__,
            f"it uses {', '.join(map(repr, outside))} from outside the function; only the function's source "
            "travels to the GPU process, container or pod",
            "import or define those names inside the function body, or pass values as arguments",
        )
        used = min((n.lineno for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in outside), default=None)
        err.source_line = (filename, first_line + (used - node.lineno if used else 0))  # the line that reads it
        raise err


def check_command(owner: str, command: object) -> None:
    """An argument list (or a string to split as a shell would, without one) that runs something."""
    accepted = "a list of strings such as ['python', 'train.py'], or one string split with shlex"
    if isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError as err:  # "No closing quotation"
            raise InvalidSettingError(
                owner, "command", command, f"cannot be split into arguments ({err})", accepted
            ) from None
    elif isinstance(command, Sequence) and not isinstance(command, (bytes, bytearray)):
        argv = list(command)
    else:
        raise InvalidSettingError(owner, "command", command, "expected a list of arguments or a string", accepted)
    for part in argv:
        if isinstance(part, bool) or not isinstance(part, (str, int, float, os.PathLike)) or "\x00" in str(part):
            raise InvalidSettingError(
                owner, "command", part, "arguments are strings (or numbers) without NUL", accepted
            )
    if not argv:
        raise InvalidSettingError(owner, "command", command, "an empty command runs nothing", accepted)
