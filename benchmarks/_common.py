"""Shared set-up for benchmark scripts: a throw-away Airflow home and side-by-side timing helpers."""

from __future__ import annotations

import gc
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import NamedTuple, TypeVar

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def airflow_home(dags_folder: Path | None = None) -> Path:
    """Point Airflow at a fresh SQLite home (before Airflow is imported) and migrate it."""
    home = Path(tempfile.mkdtemp(prefix="airflow-gpu-bench-"))
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder or REPO / "dags"),
            "AIRFLOW__GPU__STATE_DIR": str(home / "gpu-state"),
            "AIRFLOW__GPU__DEVICES": os.environ.get("AIRFLOW__GPU__DEVICES", "auto"),
        }
    )
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)
    return home


def alternate(runs: int, **contenders: Callable[[], object]) -> dict[str, list[float]]:
    """Time each contender ``runs`` times, interleaved (A B A B ...) so drift hits all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(runs):
        for name, function in contenders.items():
            started = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - started)
    return times


def report(title: str, times: dict[str, list[float]], baseline: str, goal: str) -> float:
    """Print medians and the ratio of the first contender to the baseline; return the ratio."""
    medians = {name: statistics.median(values) for name, values in times.items()}
    subject = next(name for name in times if name != baseline)
    ratio = medians[subject] / medians[baseline]
    print(f"\n## {title}")
    for name, values in times.items():
        print(
            f"  {name:<34} median {medians[name] * 1000:9.1f} ms   (n={len(values)}, "
            f"min {min(values) * 1000:.1f}, max {max(values) * 1000:.1f})"
        )
    print(f"  ratio {subject} / {baseline} = {ratio:.3f}x   (goal {goal})")
    return ratio


def in_child(measure: Callable[[], T | None]) -> T | None:
    """Run ``measure`` in a child forked from this process (what it imported stays imported); what it returned
    (picklable), or ``None`` when it failed or returned ``None``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            with os.fdopen(write_end, "wb") as out:
                pickle.dump(measure(), out)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reply:
        data = reply.read()
    os.waitpid(pid, 0)
    return pickle.loads(data) if data else None


class ParseCost(NamedTuple):
    """What one parse of a DAG file cost its parse child (DagBag and serialisation, as Airflow's ``_parse_file``)."""

    cpu: float  #: the child's CPU seconds (user + system) for the parse
    wall: float  #: its wall-clock seconds (what a loaded machine's other work adds to)
    full_collections: int  #: gen-2 (full) garbage collections during the parse
    collections: int  #: garbage collections of any generation during the parse
    gc_cpu: float  #: CPU seconds spent in those collections
    survivors: int  #: objects the collector tracks after the parse less before (what the parse left alive)
    imported: tuple[str, ...]  #: the modules the parse imported


def dag_processor_parent(paths: Iterable[Path]) -> None:
    """Do in this process what ``airflow dag-processor`` does before it forks a parse child (Airflow 3.3).

    The command loads the providers' configuration and builds its job runner: a ``Job`` (whose ``__init__`` loads
    the listener plugins and calls their ``on_starting``) and a ``DagFileProcessorManager``; the manager freezes the
    heap (``gc.freeze()`` in ``before_run``), then, before each parse, pre-imports the file's ``airflow.*``
    imports (``[dag_processor] parsing_pre_import_modules``, ``DagFileProcessorProcess.start``), which stay
    unfrozen. The listeners tell the component by its command line, as the CLI gives it.
    """
    import argparse

    import structlog
    from airflow.cli.commands import dag_processor_command
    from airflow.dag_processing.processor import _pre_import_airflow_modules
    from airflow.utils.providers_configuration_loader import providers_configuration_loaded

    argv, sys.argv = sys.argv, [sys.argv[0], "dag-processor"]
    try:
        providers_configuration_loaded(dag_processor_command._create_dag_processor_job_runner)(
            argparse.Namespace(bundle_name=None, num_runs=-1)
        )
    finally:
        sys.argv = argv
    gc.freeze()
    for path in paths:
        _pre_import_airflow_modules(str(path), structlog.get_logger())


def parse_cost(path: Path, environment: Mapping[str, str] | None = None, *, profile: Path | None = None) -> ParseCost:
    """Parse one DAG file the way Airflow's DAG processor does, in a child forked from this process.

    The child runs the processor's own ``_parse_file`` (the stability check, ``BundleDagBag``, every DAG
    serialised), as ``_parse_file_entrypoint`` does in the ``client`` context. Call :func:`dag_processor_parent`
    first.

    :param environment: the deployment's configuration in the child (``AIRFLOW__CORE__EXECUTOR``, ...)
    :param profile: write the child's cProfile statistics of the parse there
    """
    import structlog
    from airflow.dag_processing.processor import DagFileParseRequest, _parse_file

    def parse() -> ParseCost | None:
        os.environ.update({**(environment or {}), "_AIRFLOW_PROCESS_CONTEXT": "client"})
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)  # the child's log lines (the processor sends them to its parent): written, not shown
        request = DagFileParseRequest(file=str(path), bundle_path=path.parent, bundle_name="bench")
        log = structlog.get_logger()
        phases: list[tuple[int, float]] = []
        gc.callbacks.append(lambda phase, info: phases.append((info["generation"], time.process_time())))
        before, modules = len(gc.get_objects()), set(sys.modules)  # the unfrozen objects; what is imported
        profiler = None
        if profile is not None:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        cpu, wall = time.process_time(), time.perf_counter()
        result = _parse_file(request, log)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(str(profile))
        gc.callbacks.clear()
        if result is None or not result.serialized_dags or result.import_errors:
            print(f"parsing {path} failed: {result and result.import_errors}", file=sys.stderr)
            return None
        starts, stops = phases[0::2], phases[1::2]  # each collection calls back at its start and its stop
        return ParseCost(
            cpu,
            wall,
            sum(1 for generation, _ in starts if generation == 2),
            len(starts),
            sum(stop - start for (_, start), (_, stop) in zip(starts, stops, strict=True)),
            len(gc.get_objects()) - before,
            tuple(sorted(set(sys.modules) - modules)),
        )

    cost = in_child(parse)
    if cost is None:
        raise RuntimeError(f"parsing {path} failed (environment {dict(environment or {})})")
    return cost


def parse_once(path: Path, environment: Mapping[str, str] | None = None) -> float:
    """The parse child's CPU seconds for one parse of ``path`` (:func:`parse_cost`)."""
    return parse_cost(path, environment).cpu


def submit_report(times: dict[str, list[tuple[float, float]]], ours: str, theirs: str, poll: float) -> None:
    """Print a submit benchmark's two parts (submit-to-function-start, end to end), each against its goal: ``ours``
    within 1.1x of ``theirs`` plus one poll interval."""

    def summary(name: str, values: list[float]) -> str:
        return f"{name}: median {statistics.median(values):.3f}s (min {min(values):.3f}, max {max(values):.3f})"

    for part, index in (("submit-to-function-start", 0), ("end to end", 1)):
        mine, hand = ([t[index] for t in times[name]] for name in (ours, theirs))
        ratio = statistics.median(mine) / statistics.median(hand)
        met = statistics.median(mine) <= 1.1 * statistics.median(hand) + poll
        print(f"{part}: {summary(ours, mine)}; {summary(theirs, hand)}; {ratio:.2f}x; "
              f"goal <= 1.1x + {poll}s: {'met' if met else 'NOT met'}")  # fmt: skip
