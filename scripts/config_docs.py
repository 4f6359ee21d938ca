"""docs/configuration.md's ``[gpu]`` tables, generated from ``config.options.OPTIONS`` and ``config.MOVED``.

    .venv/bin/python scripts/config_docs.py          # rewrite the page's generated tables
    .venv/bin/python scripts/config_docs.py --check  # exit 1 when the page and the tables disagree

``tests/test_provider.py`` runs the check.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from airflow_gpu_provider import config

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end -->)", re.DOTALL)


def options_table() -> str:
    """One row per ``[gpu]`` option: its name, default and one-line meaning (``Option.short``)."""
    rows = [
        f"| `{o.name}` | {f'`{o.default}`' if o.default else '(empty)'} | {o.short or o.description} |"
        for o in config.OPTIONS
    ]
    return "\n".join(["| option | default | meaning |", "| --- | --- | --- |", *rows]) + "\n"


def moved_table() -> str:
    """One row per replacement of the options removed in 0.2.0, the removed names joined."""
    removed: dict[str, list[str]] = {}
    for name, moved in config.MOVED.items():
        removed.setdefault(moved.replacement, []).append(f"`{name}`")
    rows = [f"| {', '.join(names)} | {replacement} |" for replacement, names in removed.items()]
    return "\n".join(["| removed | replacement |", "| --- | --- |", *rows]) + "\n"


TABLES = {"options": options_table, "moved": moved_table}


def render(page: str) -> str:
    """``page`` with each ``<!-- generated: NAME -->`` ... ``<!-- end -->`` block rewritten from the tables."""
    return BLOCK.sub(lambda m: m.group(1) + TABLES[m.group(2)]() + m.group(4), page)


def main(argv: list[str] | None = None) -> int:
    """Rewrite the page's tables, or with ``--check`` only say whether it is up to date (exit 1: stale)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when docs/configuration.md is out of date")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    wanted = render(page)
    if page == wanted:
        return 0
    if args.check:
        print(f"{PAGE} disagrees with config.OPTIONS / config.MOVED: run scripts/config_docs.py", file=sys.stderr)
        return 1
    PAGE.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
