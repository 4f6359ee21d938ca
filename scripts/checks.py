"""What ``gpu_check.py`` and ``cluster_check.py`` share: the ``--only`` / ``--list`` arguments and the result table."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def add_selection(parser: argparse.ArgumentParser, checks: Mapping[str, Any]) -> None:
    """``--only a,b`` (repeatable; an unknown name is an error listing the checks) and ``--list``."""

    def names(value: str) -> list[str]:
        named = [part.strip() for part in value.split(",") if part.strip()]
        unknown = [name for name in named if name not in checks]
        if unknown or not named:
            raise argparse.ArgumentTypeError(
                f"unknown check(s) {unknown or [value]}; the checks are: {', '.join(checks)}"
            )
        return named

    parser.add_argument("--only", type=names, action="append", help="comma-separated checks to run")
    parser.add_argument("--list", action="store_true", help="print the checks and exit")


def selected(arguments: argparse.Namespace, checks: Mapping[str, Any]) -> list[str]:
    """The checks ``--only`` named (each once, in the order given), else all of them."""
    return list(dict.fromkeys(name for group in arguments.only or [list(checks)] for name in group))


def list_checks(checks: Mapping[str, Callable[..., Any]]) -> None:
    """``--list``: each check's name and the first line of its docstring."""
    width = max(map(len, checks)) + 1
    for name, check in checks.items():
        print(f"{name:<{width}} {(check.__doc__ or name).strip().splitlines()[0].rstrip('.')}")


def format_table(rows: Sequence[tuple[str, str, str]]) -> str:
    """``check | result | detail`` as an aligned text table."""
    header = ("check", "result", "detail")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(2)]
    lines = [f"{header[0]:<{widths[0]}} | {header[1]:<{widths[1]}} | {header[2]}"]
    lines.append(f"{'-' * widths[0]}-+-{'-' * widths[1]}-+-{'-' * 40}")
    lines += [f"{name:<{widths[0]}} | {result:<{widths[1]}} | {detail}" for name, result, detail in rows]
    return "\n".join(lines)
