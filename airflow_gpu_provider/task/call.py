"""A call of a shipped function: its arguments bound to the signature at parse, as JSON when the task starts.

Arguments and return values travel as JSON: ``None``, ``bool``, ``int``, ``float``, ``str``, and lists/dicts of
those (tuples arrive as lists). A call's mistakes (an unknown keyword, one missing, too many) are named with the
function's signature when the DAG is parsed.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from airflow_gpu_provider.exceptions import InvalidSettingError, closest
from airflow_gpu_provider.runtime.protocol import JSON_VALUES, json_problem
from airflow_gpu_provider.task.callable import CONTEXT_VALUES, ShippedCallable, known_context_keys

JSON_ACCEPTED = "None, bool, int, float (finite), str, and lists/dicts of those (or an upstream task's XCom)"


def _unresolved_as_none(value: Any) -> Any:
    """``value`` with upstream XCom references (resolved when the task runs) replaced by ``None``."""
    from airflow.sdk.definitions._internal.mixins import ResolveMixin

    if isinstance(value, ResolveMixin):
        return None
    if isinstance(value, (list, tuple)):
        return [_unresolved_as_none(item) for item in value]
    if isinstance(value, dict):
        return {key: _unresolved_as_none(item) for key, item in value.items()}
    return value


def _check_json_argument(owner: str, field: str, value: Any) -> None:
    """At DAG parse time: an argument that can never travel as JSON is an error now, not when the task starts."""
    try:
        json.dumps(_unresolved_as_none(value), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as err:
        raise InvalidSettingError(
            owner, field, value, f"a {type(value).__name__} cannot travel as JSON ({err})", JSON_ACCEPTED
        ) from None


def _plain(value: Any) -> Any:
    """``value`` with the sequences Airflow resolves an upstream's XCom to (a mapped task's results) made lists.

    A lazy sequence is read in one slice: iterating it asks for one item past its end, which Airflow logs as an
    ERROR ("XCom not found") on a run that succeeds.
    """
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        return [_plain(item) for item in value[:]]
    return value


def _json_checked(owner: str, label: str, value: Any) -> Any:
    value = _plain(value)
    problem = json_problem(value, label)
    if problem is not None:
        raise TypeError(f"{owner}: {problem}, which cannot travel as JSON. GPU tasks take {JSON_VALUES}")
    return json.loads(json.dumps(value, allow_nan=False))


def call_arguments(
    shipped: ShippedCallable,
    signature: inspect.Signature,
    op_args: Sequence[Any],
    op_kwargs: Mapping[str, Any],
    context: Mapping[str, Any],
    *,
    owner: str,
) -> tuple[list[Any], dict[str, Any]]:
    """JSON-checked positional and keyword arguments, with the requested context values filled in."""
    kwargs = dict(op_kwargs)
    bound = signature.bind_partial(*op_args, **kwargs).arguments
    for key in shipped.context_params:
        if key not in bound:
            kwargs[key] = CONTEXT_VALUES[key](context)
    args = [_json_checked(owner, f"positional argument {i}", a) for i, a in enumerate(op_args)]
    return args, {k: _json_checked(owner, f"argument {k}", v) for k, v in kwargs.items()}


def check_call_arguments(
    owner: str,
    function: Callable[..., Any],
    args: object,
    kwargs: object,
    signature: inspect.Signature | None = None,
    *,
    complete: bool = True,
) -> None:
    """Arguments that the function cannot take, or that cannot travel as JSON, are an error now, not on the GPU.

    :param complete: all the arguments are given (a task's call); ``False``: more may come (``.partial()``,
        ``.expand()``), so a missing one is no error yet
    """
    if isinstance(args, (str, bytes, bytearray, Mapping)) or not isinstance(args, Collection):
        raise InvalidSettingError(owner, "op_args", args, "expected a list of positional arguments", "a list")
    if not isinstance(kwargs, Mapping) or not all(isinstance(key, str) for key in kwargs):
        raise InvalidSettingError(owner, "op_kwargs", kwargs, "expected a dict of keyword arguments", "a dict of str")
    args, kwargs = list(args), dict(kwargs)
    for index, value in enumerate(args):
        _check_json_argument(owner, f"op_args[{index}]", value)
    for key, value in kwargs.items():
        _check_json_argument(owner, f"op_kwargs[{key!r}]", value)
    check_binding(owner, function, args, kwargs, signature or inspect.signature(function), complete=complete)


def check_binding(
    owner: str,
    function: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    signature: inspect.Signature,
    *,
    complete: bool = True,
) -> None:
    """The call's arguments bound to the function's signature; a mistake named with the signature (not its values).

    Context keys the function names (``params``, ``ds``, ...) are filled in when the task runs: never missing.
    """
    try:
        (signature.bind if complete else signature.bind_partial)(*args, **kwargs)
        return  # the common case: bound as it is
    except TypeError as err:
        mistakes = _call_mistakes(signature, args, kwargs, complete)  # None: only context keys are missing
        if mistakes is None:
            try:
                signature.bind_partial(*args, **kwargs)
            except TypeError:  # what the words do not cover (a positional-only name given by keyword)
                mistakes = str(err)
    if mistakes is not None:
        name = function.__name__
        positional = [*list(signature.parameters)[: len(args)], *["..."] * (len(args) > len(signature.parameters))]
        shown = [*positional, *(f"{key}=..." for key in kwargs)]
        raise InvalidSettingError(
            owner, f"{name}({', '.join(shown)})", ..., mistakes, f"the parameters of {name}{signature}"
        )


def _call_mistakes(
    signature: inspect.Signature, args: Sequence[Any], kwargs: Mapping[str, Any], complete: bool
) -> str | None:
    """The call's mistakes in words: each unknown keyword (with the closest parameters), too many, missing."""
    kinds = inspect.Parameter
    params = signature.parameters
    if any(p.kind == kinds.VAR_KEYWORD for p in params.values()):
        unknown: list[str] = []
    else:
        unknown = [key for key in kwargs if key not in params or params[key].kind == kinds.POSITIONAL_ONLY]
    positional = [p for p in params.values() if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind == kinds.VAR_POSITIONAL for p in params.values())
    given = {p.name for p in positional[: len(args)]} | set(kwargs)
    mistakes = []
    missing = [
        name
        for name, p in params.items()
        if complete and p.default is kinds.empty and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
        and name not in given and name not in known_context_keys()
    ]  # fmt: skip
    if unknown:
        hint = closest(unknown, params) or (f"Did you mean {' or '.join(map(repr, missing))}?" if missing else "")
        mistakes.append(f"no parameter {', '.join(map(repr, unknown))}" + (f" ({hint})" if hint else ""))
    if not varargs and len(args) > len(positional):
        mistakes.append(f"{len(args)} positional arguments for {len(positional)} parameters")
    twice = sorted({p.name for p in positional[: len(args)]} & set(kwargs))
    if twice:
        mistakes.append(f"{', '.join(map(repr, twice))} given twice (by position and by name)")
    if missing:
        mistakes.append(f"{', '.join(map(repr, missing))} missing")
    return "; ".join(mistakes) or None
