"""Shared set-up for benchmark scripts: a throw-away Airflow home and side-by-side timing helpers."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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


def in_child(measure: Callable[[], float | None]) -> float | None:
    """Run ``measure`` in a child forked from this process (what it imported stays imported); its seconds, or
    ``None`` when it failed or returned ``None``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            seconds = measure()
            os.write(write_end, ("nan" if seconds is None else str(seconds)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    reply = os.read(read_end, 64).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    return None if reply in ("", "nan") else float(reply)


def parse_once(path: Path, environment: Mapping[str, str] | None = None) -> float:
    """Parse one DAG file the way Airflow's DAG processor does: in a child forked from a process that has
    pre-imported the file's ``airflow.*`` imports, building the DagBag and serialising every DAG.

    :param environment: the deployment's configuration in the child (``AIRFLOW__CORE__EXECUTOR``, ...)
    """
    from airflow.dag_processing.dagbag import BundleDagBag
    from airflow.serialization.serialized_objects import DagSerialization

    def parse() -> float | None:
        os.environ.update(environment or {})
        started = time.perf_counter()
        bag = BundleDagBag(dag_folder=str(path), bundle_path=path.parent, bundle_name="bench", load_op_links=False)
        for dag in bag.dags.values():
            DagSerialization.to_dict(dag)
        return time.perf_counter() - started if bag.dags and not bag.import_errors else None

    seconds = in_child(parse)
    if seconds is None:
        raise RuntimeError(f"parsing {path} failed (environment {dict(environment or {})})")
    return seconds
