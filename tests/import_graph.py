"""The package's import graph, read from its source (the AST of every module), and its floors.

What ``test_architecture.py`` checks the rules of docs/architecture.md on.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "airflow_gpu_provider"
NAME = "airflow_gpu_provider"
#: The floors, from the bottom: a module imports only from its own floor or those below it (lazy and type-checking
#: imports included). A module's floor is that of the longest prefix naming it ("" is the package's own
#: ``__init__``). docs/architecture.md ("Dependency rules") shows the same order.
FLOORS: tuple[tuple[str, ...], ...] = (
    # the stdlib runtime, shipped into children, containers, pods and jobs, and its archive (stdlib only: the Docker
    # authorization plugin, which imports no Airflow, builds its own archive with it)
    ("runtime", "version", "task.runtime_zip"),
    ("exceptions", "dag_line", "task.labels"),  # task.labels: the label names, which the policy checks too
    ("settings",),  # pure, validated values
    ("config",),  # the [gpu] options
    ("policy", "checkpoint.location", "hooks.cuda"),  # what a task may get of a host; where its checkpoints go
    ("task",),  # one try: the request, the envelope, the result
    ("host", "launchers"),  # the host's GPUs, locks and workers; the launchers' options
    ("backends",),  # the backends and the job wing (each backend: its own package)
    ("escalation",),  # the OOM ladder, failure classes, retries
    ("telemetry",),  # profiles, advice, right-sizing, the GPU tab
    ("checkpoint", "hooks", "pools", "render"),  # the listeners and the render CLI, which use the backends
    ("operators",),  # thin operators
    ("decorators", "params"),
    ("", "plugin", "get_provider_info"),
)
#: Packages under backends/ that several backends share; not backends (no registry entry).
SHARED = ("pods", "jobs")


def floor_of(module: str) -> int:
    """The floor of a module of the package (:data:`FLOORS`)."""
    inside = module[len(NAME) + 1 :] if module != NAME else ""
    best, floor = -1, -1
    for number, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if (inside == prefix or inside.startswith(f"{prefix}.") or not prefix) and len(prefix) > best:
                best, floor = len(prefix), number
    return floor


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(module: str) -> Iterator[str]:
    """Every module of the package that ``module`` imports, anywhere in the file."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for name in targets:
            found = name
            while found and found not in MODULES:  # `import a.b.c` names a module or one of its packages
                found = found.rpartition(".")[0]
            if found.startswith(NAME) and found != module:
                yield found


GRAPH = {module: set(_imports(module)) for module in MODULES}
