"""The package's shape, as docs/architecture.md draws it, checked over its source (the AST of every module).

- no import cycle between files, lazy and type-checking imports included;
- every module imports only from its own floor and those below (``import_graph.FLOORS``: settings -> config ->
  policy -> task -> host -> backends -> escalation -> telemetry -> listeners -> operators -> decorators);
- backends never import each other (the shared ``backends/pods/`` and ``backends/jobs/`` are not backends);
- DAG parsing needs only each backend's options half (and its placement): an options module imports no run-time
  module;
- every registry entry names a backend package whose halves exist and agree with it (the executor backend runs
  with the local run half, on options of the same shape);
- the runtime (``runtime/``) imports only the standard library and itself (relatively: it is shipped under another
  name), the worker imports only its protocol, its pinned subreaper and its CUDA helpers, and its archive is the same bytes every time;
- modules stay small: nothing over 300 lines, the runtime's modules included.
"""

from __future__ import annotations

import ast
import inspect
import os
import shutil
import sys
from collections.abc import Iterator

import pytest
from import_graph import FLOORS, GRAPH, MODULES, NAME, SHARED, floor_of

from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.backends.base import Backend
from airflow_gpu_provider.backends.options import BackendOptions
from airflow_gpu_provider.task import runtime_zip

MAX_LINES = 300
RUNTIME = f"{NAME}.runtime"
#: What the worker runs of the runtime in its own process: the protocol, the pinned subreaper (the local supervisor's
#: and a job's entrypoint's: one code), and the CUDA helpers (CudaHook and the
#: host's GPU inventory must run the very code the task process runs). Everything else runs from the archive.
WORKER_IMPORTS_OF_THE_RUNTIME = {f"{RUNTIME}.protocol", f"{RUNTIME}.cuda", f"{RUNTIME}.reaper"}
#: The task's own packages, which the runtime uses inside a function when the task's environment has them.
TASK_PACKAGES = {"torch", "pynvml", "fsspec", "accelerate"}


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in GRAPH[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in GRAPH:
        if module not in index:
            visit(module)
    return found


def test_the_import_graph_was_read():
    assert f"{NAME}.backends.kubernetes.plan" in GRAPH[f"{NAME}.backends.kubernetes.backend"]
    assert f"{NAME}.backends.docker.options" in GRAPH[f"{NAME}.backends.docker.images.engine"]
    assert f"{NAME}.render" in GRAPH[f"{NAME}.operators.gpu_step"]  # lazy imports count too


def test_no_import_cycles_between_files():
    assert _cycles() == []


def _backend_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "backends" and parts[2] not in SHARED else None


def test_every_module_imports_only_its_floor_and_those_below():
    """settings -> config -> policy -> task -> host -> backends -> escalation -> telemetry -> ... -> operators."""
    assert all(floor_of(module) >= 0 for module in MODULES)
    upward = [
        f"{module} (floor {FLOORS[floor_of(module)]}) imports {target} (floor {FLOORS[floor_of(target)]})"
        for module in MODULES
        for target in GRAPH[module]
        if floor_of(target) > floor_of(module)
    ]
    assert upward == []


def test_the_floors_are_read_as_written():
    assert floor_of(f"{NAME}.checkpoint.location") < floor_of(f"{NAME}.task.request")  # a task's folder
    assert floor_of(f"{NAME}.checkpoint.mixin") > floor_of(f"{NAME}.backends.docker.backend")  # uses backends
    assert floor_of(f"{NAME}.hooks.cuda_cache") > floor_of(f"{NAME}.hooks.cuda")
    assert floor_of(NAME) == len(FLOORS) - 1 and floor_of(f"{NAME}.runtime.reaper") == 0


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_backend_imports_no_other_backend(backend):
    own = [m for m in MODULES if _backend_of(m) == backend]
    assert own, f"backends/{backend}/ is empty"
    for module in own:
        for target in GRAPH[module]:
            other = _backend_of(target)
            assert other in (None, backend), f"{module} imports {target}: backends never import each other"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_the_options_half_imports_no_run_time_module(backend):
    """DAG parsing imports a backend's options module only; it must not pull the run half in."""
    options = BACKENDS[backend].options.split(":")[0]
    seen, todo = set(), [options]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(GRAPH[module])
    run_half = BACKENDS[backend].backend.split(":")[0]
    assert run_half not in seen
    assert not any(m.endswith(("pod_operator", "multinode_run", "images.engine", ".venv")) for m in seen), seen


#: Backends that run their tasks with another backend's run half (docs/architecture.md says why).
RUNS_LIKE = {"executor": "local"}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_registry_entries_name_their_package_halves(backend):
    info = BACKENDS[backend]
    runs_like = RUNS_LIKE.get(backend, backend)
    assert info.backend.startswith(f"{NAME}.backends.{runs_like}.backend:")
    assert info.options.startswith(f"{NAME}.backends.{backend}.options:")
    options_class, backend_class = info.options_class(), info.backend_class()
    assert issubclass(options_class, BackendOptions) and options_class.backend == backend
    assert issubclass(backend_class, Backend) and backend_class.name == runs_like
    assert info.parse_options({}) == options_class()
    if runs_like != backend:  # the shared run half must take these options
        own_options = BACKENDS[runs_like].options_class()
        shared = next(c for c in own_options.__mro__[1:] if c is not BackendOptions and issubclass(c, BackendOptions))
        assert issubclass(options_class, shared), f"{options_class} must be a {shared} for {backend_class}"


def test_the_executor_backend_shapes_its_pod_with_the_shared_pod_mapping():
    """The KubernetesExecutor pod_override comes from backends/pods/, as the kubernetes backend's pods do."""
    shared = {target for target in GRAPH[f"{NAME}.backends.executor.pod_override"] if ".backends.pods." in target}
    assert {f"{NAME}.backends.pods.resources", f"{NAME}.backends.pods.scheduling"} <= shared
    assert f"{NAME}.backends.pods.scheduling" in GRAPH[f"{NAME}.backends.kubernetes.plan"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module}: {lines} lines"


def _absolute_imports(tree: ast.AST) -> Iterator[tuple[str, bool]]:
    """``(top-level name, inside a function)`` of every absolute import; relative ones are checked by the graph."""

    def visit(node: ast.AST, in_function: bool) -> Iterator[tuple[str, bool]]:
        if isinstance(node, ast.Import):
            yield from ((alias.name.split(".")[0], in_function) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            yield (node.module or "").split(".")[0], in_function
        inside = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inside)

    yield from visit(tree, False)


RUNTIME_MODULES = sorted(m for m in MODULES if m == RUNTIME or m.startswith(f"{RUNTIME}."))


@pytest.mark.parametrize("module", RUNTIME_MODULES)
def test_the_runtime_imports_only_the_standard_library_and_itself(module):
    """It runs in any image with python3, as ``airflow_gpu_runtime``: never ``airflow_gpu_provider`` by name."""
    tree = ast.parse(MODULES[module].read_text())
    for name, in_function in _absolute_imports(tree):
        allowed = name in sys.stdlib_module_names or (in_function and name in TASK_PACKAGES)
        assert allowed, f"{module} imports {name}: the runtime imports the stdlib, and itself relatively"
    outside = {target for target in GRAPH[module] if not target.startswith(RUNTIME)}
    assert outside == set(), f"{module} imports {outside}"


def test_the_worker_imports_only_the_protocol_and_the_cuda_helpers_of_the_runtime():
    used = {t for m in MODULES if not m.startswith(RUNTIME) for t in GRAPH[m] if t.startswith(RUNTIME)}
    assert used == WORKER_IMPORTS_OF_THE_RUNTIME, used
    assert GRAPH[f"{RUNTIME}.cuda"] == set()  # run in the worker's own process: it imports nothing of the runtime


def test_the_runtime_archive_is_the_same_bytes_every_time(tmp_path):
    """Built twice, and from a copy with other dates, modes and a ``__pycache__``: the same bytes, so the same digest
    (a derived image's tag is built on it)."""
    first, second = runtime_zip.build(), runtime_zip.build()
    assert first == second == runtime_zip.archive()
    copy = tmp_path / "runtime"
    shutil.copytree(runtime_zip.RUNTIME_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for number, path in enumerate(sorted(copy.rglob("*.py"))):
        path.chmod(0o600 if number % 2 else 0o755)
        os.utime(path, (1_234_567_890 + number, 1_234_567_890 + number))
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "protocol.cpython-311.pyc").write_bytes(b"not source")
    assert runtime_zip.build(copy) == first


#: The GPU operators, and the arguments ``@task.gpu`` takes beside an operator's (``accelerate=`` picks the class).
GPU_OPERATORS = ("GpuStepOperator", "AccelerateOperator")


def _documented(cls: type) -> list[str]:
    """The arguments a class's docstring documents (``:param name:``)."""
    import re

    return re.findall(r"^\s*:param (\w+):", cls.__doc__ or "", re.MULTILINE)


@pytest.mark.parametrize("name", GPU_OPERATORS)
def test_every_documented_argument_is_accepted_by_partial_expand_and_the_decorator(name):
    """What caught ``GpuStepOperator.partial(checkpoint=...)`` raising ``TypeError``: Airflow's ``.partial()`` and
    ``.expand()`` accept only the arguments an operator's (or its bases') ``__init__`` declares, and a mixin's
    ``__init__`` is invisible to them. Every argument a GPU operator documents must be one of those, and be
    documented where it is declared."""
    from airflow.sdk.definitions.mappedoperator import validate_mapping_kwargs

    import airflow_gpu_provider
    from airflow_gpu_provider.decorators.gpu import _accelerate_operator_class, _GpuDecoratedOperator

    operator = getattr(airflow_gpu_provider, name)
    documented = _documented(operator)
    assert documented, f"{name} documents no argument"
    validate_mapping_kwargs(operator, "partial", dict.fromkeys(documented))  # raises TypeError for one it lacks
    validate_mapping_kwargs(operator, "expand", {argument: [] for argument in documented})
    decorated = _GpuDecoratedOperator if name == "GpuStepOperator" else _accelerate_operator_class()
    validate_mapping_kwargs(decorated, "partial", dict.fromkeys(documented))  # what @task.gpu's operator takes
    own = set(inspect.signature(operator.__init__).parameters) - {"self", "kwargs"}
    undocumented = own - set(documented) - set(_documented(operator.__mro__[1]))
    assert not undocumented, f"{name} declares {undocumented} without documenting them"
    from airflow.sdk import BaseOperator

    mixins = [
        base for base in operator.__mro__ if base.__module__.startswith(NAME) and BaseOperator not in base.__mro__
    ]
    assert mixins, "the provider's mixins were not found"
    for mixin in mixins:
        assert "__init__" not in vars(mixin), f"{mixin.__name__}.__init__'s arguments are invisible to .partial()"
