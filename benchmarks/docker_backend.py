"""Docker backend speed, measured side by side in one run on a real engine.

1. Warm run: ``GpuStepOperator(backend="docker")`` with a cached derived image vs a raw ``DockerOperator`` with the
   same image and command (both ``execute()`` called directly, interleaved). Goal: <= 1.15x.
2. Re-run with unchanged requirements: derived-image builds (goal: 0) and the cache check's time (goal: < 1 s).
3. Derived-image build with uv vs pip, same requirements, no layer cache. Goal: uv >= 3x faster. Measured with and
   without bytecode compilation (pip compiles .pyc files by default; uv only with --compile-bytecode, which derived
   images use by default), for the whole build and for the install step alone (the engine's commit of the new
   layer afterwards is the same work for both installers).

    python benchmarks/docker_backend.py [--runs 10] [--builds 2] [--base-image airflow-gpu-base:bookworm]

Needs a Docker engine, the base image (docker/base/build.sh) and PyPI access for part 3.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

from airflow_gpu_provider.config.worker import GpuConfig

_HOME = None if "AIRFLOW_HOME" in os.environ else tempfile.mkdtemp(prefix="airflow-gpu-bench-")
os.environ.setdefault("AIRFLOW_HOME", _HOME or "")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__GPU__STATE_DIR", os.path.join(os.environ["AIRFLOW_HOME"], "gpu-state"))

COMMAND = ["python3", "-c", "print('hello from the container')"]
SMALL_REQUIREMENTS = ["six==1.16.0"]
BUILD_REQUIREMENTS = ["numpy==2.2.6", "pandas==2.2.3", "scikit-learn==1.6.1"]
REPOSITORY = "airflow-gpu-bench-derived"


class Counter(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def count(self, text: str) -> int:
        return sum(text in m for m in self.messages)


def quiet_logger(name: str) -> tuple[logging.Logger, Counter]:
    logger = logging.getLogger(name)
    counter = Counter()
    logger.handlers = [counter]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, counter


def context(task_id: str) -> dict:
    ti = SimpleNamespace(dag_id="bench", task_id=task_id, run_id="bench", try_number=1, map_index=-1)
    return {"ti": ti}


def prepared_image(base_image: str) -> tuple[str, int, float]:
    """Build (or find) the derived image; then re-check it as a re-run does.

    :return: the image, the builds the re-checks started, and the slowest re-check
    """
    from airflow_gpu_provider.backends import BACKENDS
    from airflow_gpu_provider.backends.docker.client import connect
    from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
    from airflow_gpu_provider.task.envelope import Envelope
    from airflow_gpu_provider.task.request import TaskRequest

    log, counter = quiet_logger("bench.cache")
    backend = BACKENDS["docker"].create({"repository": REPOSITORY}, log=log)
    image = ImageSettings(parent_image=base_image, requirements=SMALL_REQUIREMENTS)
    plan = backend.plan(TaskRequest(ResourceSettings(), image, Envelope.run(COMMAND)), GpuConfig.read())
    client = connect(backend.options)
    tag = backend._image(client, plan)
    builds_before, slowest = counter.count("Building derived image"), 0.0
    for _ in range(5):
        started = time.perf_counter()
        backend._image(client, plan)  # parent lookup, content hash, derived-tag lookup: what run() does first
        slowest = max(slowest, time.perf_counter() - started)
    return tag, counter.count("Building derived image") - builds_before, slowest


def warm_run(base_image: str, tag: str, runs: int) -> tuple[float, float, float]:
    """Median seconds of GpuStepOperator.execute and DockerOperator.execute (interleaved), median pair ratio."""
    from airflow.providers.docker.operators.docker import DockerOperator

    from airflow_gpu_provider import GpuStepOperator, ImageSettings

    image = ImageSettings(parent_image=base_image, requirements=SMALL_REQUIREMENTS)

    def operators() -> tuple[GpuStepOperator, DockerOperator]:
        # fresh instances, as every task try gets: neither keeps a Docker client from the previous run
        gpu_op = GpuStepOperator(
            task_id="gpu_step",
            command=COMMAND,
            backend="docker",
            image=image,
            backend_options={"repository": REPOSITORY},
        )
        return gpu_op, DockerOperator(task_id="raw", image=tag, command=COMMAND, auto_remove="force")

    for operator in operators():  # warm-up
        operator.execute(context(operator.task_id))
    ours, raw = [], []
    for _ in range(runs):
        gpu_op, docker_op = operators()
        started = time.perf_counter()
        gpu_op.execute(context("gpu_step"))
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        docker_op.execute(context("raw"))
        raw.append(time.perf_counter() - started)
    ratios = [a / b for a, b in zip(ours, raw, strict=True)]
    return statistics.median(ours), statistics.median(raw), statistics.median(ratios)


class Timeline(logging.Handler):
    """The build log with the time of each line."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.created, record.getMessage()))

    def install_seconds(self) -> float:
        """From the install step's start to its last output line: the installer's own time, without the engine
        committing the new layer afterwards (the same work for both installers)."""
        start = max(i for i, (_, line) in enumerate(self.lines) if line.startswith("Step ") and " : RUN " in line)
        done = next(
            i for i in range(start + 1, len(self.lines)) if "Removing intermediate container" in self.lines[i][1]
        )
        return self.lines[done - 1][0] - self.lines[start][0]


def timed_build(client, base_image: str, installer: str, compile_bytecode: bool) -> tuple[float, float, str]:
    """Seconds for the whole build and for the install step alone, and the image built."""
    from uv import find_uv_bin

    from airflow_gpu_provider.backends.docker.images.dockerfile import BuildOptions, derived_image_spec
    from airflow_gpu_provider.backends.docker.images.engine import build_image
    from airflow_gpu_provider.settings import ImageSettings

    image = ImageSettings(parent_image=base_image, requirements=BUILD_REQUIREMENTS, python_package_installer=installer)
    options = BuildOptions(repository=REPOSITORY, compile_bytecode=compile_bytecode)
    spec = derived_image_spec(base_image, image, options, uv_binary=find_uv_bin())
    tag = f"{REPOSITORY}:build-{installer}-{int(compile_bytecode)}"
    log = logging.getLogger(f"bench.build.{installer}.{compile_bytecode}")
    timeline = Timeline()
    log.handlers, log.propagate = [timeline], False
    log.setLevel(logging.INFO)
    started = time.perf_counter()
    build_image(client, spec, tag, log, nocache=True)
    return time.perf_counter() - started, timeline.install_seconds(), tag


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="warm runs of each operator")
    parser.add_argument("--builds", type=int, default=2, help="builds per installer")
    parser.add_argument("--base-image", default="airflow-gpu-base:bookworm")
    parser.add_argument("--skip-builds", action="store_true", help="skip part 3 (needs PyPI)")
    args = parser.parse_args()

    import docker

    client = docker.APIClient(version="auto")
    rows: list[tuple[str, str, str]] = []
    try:
        tag, rebuilds, slowest = prepared_image(args.base_image)
        ours, raw, ratio = warm_run(args.base_image, tag, args.runs)
        rows.append(
            (
                "warm run: GpuStepOperator / DockerOperator (medians; median of pair ratios)",
                f"{ours:.3f}s / {raw:.3f}s; {ratio:.2f}x",
                "<= 1.15x",
            )
        )
        rows.append(("re-run, same requirements: rebuilds", str(rebuilds), "0"))
        rows.append(("re-run, same requirements: cache check (slowest of 5)", f"{slowest * 1000:.0f} ms", "< 1 s"))
        if not args.skip_builds:
            for compiled in (True, False):
                times: dict[str, list[tuple[float, float]]] = {"pip": [], "uv": []}
                for _ in range(args.builds):
                    for installer in ("pip", "uv"):
                        whole, install, built = timed_build(client, args.base_image, installer, compiled)
                        times[installer].append((whole, install))
                        client.remove_image(built, force=True)
                pip_whole, pip_install = (statistics.median(t[i] for t in times["pip"]) for i in (0, 1))
                uv_whole, uv_install = (statistics.median(t[i] for t in times["uv"]) for i in (0, 1))
                what = "with .pyc (default)" if compiled else "no .pyc (compile_bytecode=False)"
                rows.append(
                    (
                        f"derived build {what}: pip / uv, whole build",
                        f"{pip_whole:.1f}s / {uv_whole:.1f}s = {pip_whole / uv_whole:.1f}x",
                        ">= 3x",
                    )
                )
                rows.append(
                    (
                        f"derived build {what}: pip / uv, install step",
                        f"{pip_install:.1f}s / {uv_install:.1f}s = {pip_install / uv_install:.1f}x",
                        ">= 3x",
                    )
                )
    finally:
        for image in client.images(name=REPOSITORY):
            client.remove_image(image["Id"], force=True)
        if _HOME:
            shutil.rmtree(_HOME, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"\n{'measure'.ljust(width)}  {'result':<34} goal")
    for name, result, goal in rows:
        print(f"{name.ljust(width)}  {result:<34} {goal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
