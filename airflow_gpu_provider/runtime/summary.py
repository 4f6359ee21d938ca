"""The resource summary that starts every GPU task's log, and what the CUDA cache held."""

from __future__ import annotations

from typing import Any

from .cuda import list_gpus
from .output import say
from .protocol import PREFIX, format_bytes


def describe_cache(result: dict[str, Any]) -> str:
    """A :func:`~.cuda.clear_cuda_cache` result in words: ``cleared, 1.5 GiB freed`` or ``skipped (why)``."""
    if result["status"] == "cleared":
        return f"cleared, {format_bytes(result['freed_bytes'])} freed"
    return f"skipped ({result['reason']})"


def print_summary(summary: dict[str, Any], cache: dict[str, Any]) -> list[dict[str, Any]]:
    """Print the resource summary that starts every GPU task's log; return the task's GPUs."""
    gpus = summary.get("gpus")
    if gpus is None:  # containers and pods: ask the device itself
        gpus = list_gpus()
    if gpus:
        gpu_text = "; ".join(f"{g['index']}: {g['name']} ({format_bytes(g.get('memory_total'))})" for g in gpus)
    else:
        gpu_text = "none (running on CPU)"
    lines = [
        f"backend={summary.get('backend')} image={summary.get('image')} "
        f"requirements={summary.get('requirements_hash')}",
        f"resources: {summary.get('resources')}",
        f"GPUs assigned: {gpu_text}",
        f"CUDA cache before task: {describe_cache(cache)}",
    ]
    for line in lines:
        say(f"{PREFIX} {line}")
    return list(gpus or [])
