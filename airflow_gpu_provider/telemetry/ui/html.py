"""The HTML shared by the pages: the layout, escaping helpers and links. No scripts, no external resources."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from html import escape
from urllib.parse import quote

from airflow_gpu_provider.telemetry.ui.format import TaskKey

# No script runs on these pages and nothing is loaded from elsewhere; the Airflow UI (same origin) may frame them.
# The one form (the GPUs page's filters, a GET) submits to the page itself.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'self'; base-uri 'none'; "
    "form-action 'self'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

STYLE = """
:root { color-scheme: light dark; --muted: #6b7280; --line: #d1d5db; --warn: #b45309; }
@media (prefers-color-scheme: dark) { :root { --muted: #9ca3af; --line: #374151; --warn: #f59e0b; } }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 16px 20px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 20px 0 8px; }
.meta, .axis, .note { color: var(--muted); } .axis { font-size: 11px; fill: currentColor; }
.grid { stroke: var(--line); stroke-width: 1; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; border: 1px solid var(--warn);
  color: var(--warn); font-size: 12px; margin-left: 8px; vertical-align: middle; }
table { border-collapse: collapse; margin: 4px 0 8px; } th, td { padding: 4px 10px; text-align: left;
  border-bottom: 1px solid var(--line); vertical-align: top; } td.num, th.num { text-align: right; }
.legend span { display: inline-block; margin-right: 14px; } .swatch { display: inline-block; width: 14px;
  height: 3px; vertical-align: middle; margin-right: 6px; }
figure.chart { margin: 4px 0 14px; } figure.chart svg { max-width: 100%; height: auto; display: block; }
figcaption { font-weight: 600; font-size: 13px; margin-bottom: 2px; } .nowrap { white-space: nowrap; }
ul.advice { margin: 0; padding-left: 16px; } ul.advice li { margin: 0 0 2px; } a { color: inherit; }
td.num, .facts td { white-space: nowrap; } form.filters { margin: 8px 0; } form.filters label { margin-right: 10px; }
"""


def e(value: object) -> str:
    """Escape any value for HTML text and attributes (quotes included)."""
    return escape(str(value), quote=True)


def layout(title: str, body: str) -> str:
    """A whole document around ``body``."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)}</title><style>{STYLE}</style></head><body>{body}</body></html>"
    )


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], *, numeric: frozenset[int] = frozenset()) -> str:
    """A table; ``headers`` are plain text, cells are HTML already escaped by the caller."""
    head = "".join(f"<th{' class=num' if i in numeric else ''}>{e(h)}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=num' if i in numeric else ''}>{cell}</td>" for i, cell in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def fact_table(facts: Iterable[tuple[str, str]]) -> str:
    """A two-column table of plain-text ``(name, value)`` pairs."""
    rows = "".join(f"<tr><th>{e(name)}</th><td>{e(value)}</td></tr>" for name, value in facts)
    return f'<table class="facts"><tbody>{rows}</tbody></table>'


def task_path(base: str, key: TaskKey) -> str:
    """The path of a task instance's page in this app (``base`` is where the app is mounted)."""
    dag_id, run_id, task_id = (quote(part, safe="") for part in (key.dag_id, key.run_id, key.task_id))
    return f"{base}/dags/{dag_id}/runs/{run_id}/tasks/{task_id}?map_index={key.map_index}"


def when(epoch: float | None) -> str:
    """Epoch seconds as ``"2026-11-23 13:40:12 UTC"``, or ``"–"``."""
    if epoch is None:
        return "–"
    try:
        return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return "–"
