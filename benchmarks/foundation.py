"""Foundation benchmarks, measured side by side in one run.

1. DAG parse time: the same 20-task DAG with plain ``@task``, Airflow's own ``@task.virtualenv``, ``@task.docker``
   and ``@task.kubernetes``, and ``@task.gpu`` (goal: at most 1.3x plain ``@task``, never more than
   ``@task.virtualenv``); ``python -X importtime`` shows no torch/accelerate/docker/kubernetes import while parsing.
2. Local @gpu_task end to end (dag.test) vs plain @task for the same function (goal <= 1.2x).
3. Cached venv reuse vs first creation.

Run: ``make bench`` or ``.venv/bin/python benchmarks/foundation.py``.
"""

from __future__ import annotations

import importlib
import logging
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _common import REPO, airflow_home, alternate, parse_once, report

TASKS = 20
WORK = textwrap.dedent(
    """
    def work(n: int) -> int:
        total = 0
        for i in range(n):
            total += i * i % 7
        return total
    """
)


#: The decorators measured side by side: name -> (decorator line, extra import). Airflow's own with the arguments
#: their docs show; ``@task.gpu`` as a DAG author writes it.
DECORATORS: dict[str, tuple[str, str]] = {
    "@task": ("task", ""),
    "@task.virtualenv": ("task.virtualenv(requirements=['tomli-w'])", ""),
    "@task.docker": ("task.docker(image='python:3.11-slim')", ""),
    "@task.kubernetes": ("task.kubernetes(image='python:3.11-slim', namespace='ml')", ""),
    "@task.gpu": ("task.gpu(gpu_count=1, memory='8Gi')", ""),
}


def write_dag(folder: Path, name: str, decorator: str, imports: str) -> Path:
    """A 20-task DAG file whose tasks all use ``decorator``."""
    body = [f"@{decorator}\n" + WORK.replace("def work", f"def work_{i}").strip() for i in range(TASKS)]
    calls = "\n".join(f"    work_{i}(10)" for i in range(TASKS))
    source = (
        "import datetime\nfrom airflow.sdk import DAG, task\n"
        + imports
        + "\n\n"
        + "\n\n".join(body)
        + f"\n\nwith DAG({name!r}, schedule=None, start_date=datetime.datetime(2024, 1, 1)):\n{calls}\n"
    )
    path = folder / f"{name}.py"
    path.write_text(source)
    return path


def write_dags(folder: Path) -> dict[str, Path]:
    """One DAG file per decorator of :data:`DECORATORS`."""
    return {
        label: write_dag(folder, "bench_" + label.strip("@").replace(".", "_"), decorator, imports)
        for label, (decorator, imports) in DECORATORS.items()
    }


def heavy_imports(path: Path) -> list[str]:
    code = f"from airflow.dag_processing.dagbag import DagBag; DagBag(dag_folder={str(path)!r})"
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    ).stderr
    modules = {line.split("|")[-1].strip() for line in err.splitlines() if line.startswith("import time:")}
    return sorted(m for m in modules if m.split(".")[0] in ("torch", "accelerate", "docker", "kubernetes", "pynvml"))


def bench_parse(folder: Path, rounds: int = 25) -> None:
    from airflow.utils.file import iter_airflow_imports

    paths = write_dags(folder)
    for path in paths.values():  # what the DAG processor manager pre-imports for each file
        for module in iter_airflow_imports(str(path)):
            importlib.import_module(module)
    samples: dict[str, list[float]] = {label: [] for label in ("@task.gpu", *[k for k in paths if k != "@task.gpu"])}
    for _ in range(rounds):  # interleaved: drift hits every contender alike
        for label, path in paths.items():
            samples[label].append(parse_once(path))
    medians = {label: statistics.median(values) for label, values in samples.items()}
    plain = medians["@task"]
    print("\n## DAG parse time, 20-task DAG, side by side (DAG-processor child: DagBag + serialisation)")
    print(f"  {'decorator':<18} {'median':>10} {'vs @task':>9}")
    for label in ("@task", "@task.virtualenv", "@task.gpu", "@task.docker", "@task.kubernetes"):
        print(f"  {label:<18} {medians[label] * 1000:8.1f} ms {medians[label] / plain:8.2f}x")
    gpu, virtualenv = medians["@task.gpu"] / plain, medians["@task.virtualenv"] / plain
    met = gpu <= 1.3 and gpu <= virtualenv
    print(f"  goal: @task.gpu <= 1.3x @task and <= @task.virtualenv ({virtualenv:.2f}x): {'met' if met else 'NOT met'}")
    print(f"  heavy modules imported while parsing the @task.gpu DAG: {heavy_imports(paths['@task.gpu']) or 'none'}")


def bench_local_end_to_end(folder: Path) -> None:
    (folder / "e2e.py").write_text(
        "import datetime\nfrom airflow.sdk import DAG, task\nfrom airflow_gpu_provider import gpu_task\n"
        + WORK
        + "\nwith DAG('e2e_plain', schedule=None, start_date=datetime.datetime(2024, 1, 1)):\n"
        "    task(work)(3_000_000)\n"
        "with DAG('e2e_gpu', schedule=None, start_date=datetime.datetime(2024, 1, 1)):\n"
        "    gpu_task(on_missing_gpu='cpu', gpu_count=1)(work)(3_000_000)\n"
    )
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(folder / "e2e.py"))
    plain, gpu = bag.get_dag("e2e_plain"), bag.get_dag("e2e_gpu")
    logging.disable(logging.WARNING)
    for dag in (plain, gpu):  # warm-up: DAG serialisation, DB rows
        dag.test()
    times = alternate(5, **{"@gpu_task (local child process)": gpu.test, "@task (in the task runner)": plain.test})
    logging.disable(logging.NOTSET)
    report(
        "Local @gpu_task end to end vs plain @task (dag.test, same function, ~0.5 s of work)",
        times,
        "@task (in the task runner)",
        "<= 1.2x",
    )


def bench_venv() -> None:
    from airflow_gpu_provider.backends.local.venv import ensure_venv
    from airflow_gpu_provider.settings import ImageSettings

    log = logging.getLogger("bench")
    image = ImageSettings(requirements=["tomli-w==1.0.0", "pyjokes==0.8.3"])
    first, cached = [], []
    for _ in range(3):
        cache = Path(tempfile.mkdtemp(prefix="bench-venv-"))
        started = time.perf_counter()
        ensure_venv(image, cache, log)
        first.append(time.perf_counter() - started)
        started = time.perf_counter()
        ensure_venv(image, cache, log)
        cached.append(time.perf_counter() - started)
    report(
        "Injected requirements: cached venv reuse vs first creation (uv)",
        {"cached venv (reuse)": cached, "first creation": first},
        "first creation",
        "much less than 1x",
    )


def main() -> None:
    """``foundation.py [parse]``: every benchmark, or the parse table alone."""
    folder = Path(tempfile.mkdtemp(prefix="airflow-gpu-bench-dags-"))
    airflow_home(folder)

    print(f"# Foundation benchmarks (python {sys.version.split()[0]}, repo {REPO})")
    bench_parse(folder)
    if sys.argv[1:] == ["parse"]:
        return
    bench_local_end_to_end(folder)
    bench_venv()


if __name__ == "__main__":
    main()
