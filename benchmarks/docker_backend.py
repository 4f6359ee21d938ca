"""Docker backend speed, measured side by side in one run on a real engine.

1. Warm run: ``GpuStepOperator(backend="docker")`` with a cached derived image vs a raw ``DockerOperator`` with the
   same image and command (both ``execute()`` called directly, interleaved, who goes first alternating), with each
   engine request's time per try. Goal: <= 1.1x.
2. Re-run with unchanged requirements: derived-image builds (goal: 0) and the cache check's time (goal: < 1 s).
3. Derived-image builds, side by side in each round: a cold build with pip, a cold build with uv (same
   requirements, no layer cache; .pyc files compiled, the default), then, with uv, the same list with one package
   added: a rebuild that reuses (``images/reuse.py``: built on the cold uv image, whose requirements it holds).
   Goals: uv >= 3x faster than pip; a one-package change <= 1/3 of the cold uv build. The install
   step alone is shown too (the engine's commit of the new layer afterwards is the same work for both installers).
   And the provider's way (an install container, committed: no ``POST /build``) beside the engine's classic builder
   running the same recipe as a Dockerfile (the provider's way before issue 34): goal <= 1.0x.

    python benchmarks/docker_backend.py [--runs 10] [--builds 2] [--base-image airflow-gpu-base:bookworm]

Needs a Docker engine, the base image (docker/base/build.sh) and PyPI access for part 3.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any

from airflow_gpu_provider.config.worker import GpuConfig

_HOME = None if "AIRFLOW_HOME" in os.environ else tempfile.mkdtemp(prefix="airflow-gpu-bench-")
os.environ.setdefault("AIRFLOW_HOME", _HOME or "")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__GPU__STATE_DIR", os.path.join(os.environ["AIRFLOW_HOME"], "gpu-state"))

COMMAND = ["python3", "-c", "print('hello from the container')"]
SMALL_REQUIREMENTS = ["six==1.16.0"]
BUILD_REQUIREMENTS = ["numpy==2.2.6", "pandas==2.2.3", "scikit-learn==1.6.1"]
CHANGED = {"one package added": [*BUILD_REQUIREMENTS, "tqdm==4.67.1"]}  # rebuilds that reuse the cold uv image
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
    ti = SimpleNamespace(dag_id="bench", task_id=task_id, run_id="bench", try_number=1, map_index=-1, stats_tags={})
    return {"ti": ti}


def prepared_image(base_image: str) -> tuple[str, int, float]:
    """Build (or find) the derived image; then re-check it as a re-run does.

    :return: the image, the builds the re-checks started, and the slowest re-check
    """
    from airflow_gpu_provider.backends import BACKENDS
    from airflow_gpu_provider.backends.docker.client import connect
    from airflow_gpu_provider.backends.docker.images.task_image import task_image
    from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
    from airflow_gpu_provider.task.envelope import Envelope
    from airflow_gpu_provider.task.request import TaskRequest

    log, counter = quiet_logger("bench.cache")
    backend = BACKENDS["docker"].create({"repository": REPOSITORY}, log=log)
    image = ImageSettings(parent_image=base_image, requirements=SMALL_REQUIREMENTS)
    plan = backend.plan(TaskRequest(ResourceSettings(), image, Envelope.run(COMMAND)), GpuConfig.read())
    client = connect(backend.options)
    with task_image(client, plan, log) as tag:
        pass
    builds_before, slowest = counter.count("Building derived image"), 0.0
    for _ in range(5):
        started = time.perf_counter()
        with task_image(client, plan, log):  # parent lookup, content hash, derived-tag lookup: what run() does first
            slowest = max(slowest, time.perf_counter() - started)
    return tag, counter.count("Building derived image") - builds_before, slowest


class EngineCalls:
    """Every Docker Engine API request this process makes (``requests``' session), with its seconds: the breakdown."""

    def __init__(self) -> None:
        import requests

        self.calls: list[tuple[str, float]] = []
        self._send = original = requests.Session.send

        def send(session: Any, request: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(session, request, **kwargs)
            finally:
                path = re.sub(r"/[0-9a-f]{12,64}(?=/|$)", "/<id>", request.path_url.split("?")[0])
                path = re.sub(r"^/v[0-9.]+", "", re.sub(r"/images/[^/]+/json", "/images/<name>/json", path))
                self.calls.append((f"{request.method} {path}", time.perf_counter() - started))

        requests.Session.send = send  # type: ignore[method-assign]

    def take(self) -> list[tuple[str, float]]:
        calls, self.calls = self.calls, []
        return calls


def warm_run(base_image: str, tag: str, runs: int) -> tuple[float, float, float]:
    """Median seconds of GpuStepOperator.execute and DockerOperator.execute (interleaved), median pair ratio.

    Prints the breakdown: each engine request's median milliseconds per try, for both, and the time outside them.
    """
    from airflow.providers.docker.operators.docker import DockerOperator

    from airflow_gpu_provider import GpuStepOperator, ImageSettings

    image = ImageSettings(parent_image=base_image, requirements=SMALL_REQUIREMENTS)
    engine = EngineCalls()

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
    times: dict[str, list[float]] = {"GpuStepOperator": [], "DockerOperator": []}
    requests: dict[str, list[dict[str, float]]] = {name: [] for name in times}
    for round_ in range(runs):
        pair = dict(zip(times, operators(), strict=True))
        for name in list(pair)[round_ % 2 :] + list(pair)[: round_ % 2]:  # who goes first alternates
            engine.take()
            started = time.perf_counter()
            pair[name].execute(context(pair[name].task_id))
            times[name].append(time.perf_counter() - started)
            per_try: dict[str, float] = {}
            for call, seconds in engine.take():
                per_try[call] = per_try.get(call, 0.0) + seconds
            requests[name].append(per_try)
    ours, raw = times["GpuStepOperator"], times["DockerOperator"]
    print(f"\n## warm run breakdown: median ms per try ({runs} tries each, interleaved, load {os.getloadavg()[0]:.1f})")
    print("| engine request | GpuStepOperator | DockerOperator |")
    print("| --- | ---: | ---: |")
    calls = sorted({c for tries in requests.values() for one in tries for c in one})
    medians = {
        name: {c: statistics.median(one.get(c, 0.0) for one in tries) * 1000 for c in calls}
        for name, tries in requests.items()
    }
    for call in sorted(calls, key=lambda c: -medians["GpuStepOperator"][c]):
        print(f"| {call} | {medians['GpuStepOperator'][call]:.1f} | {medians['DockerOperator'][call]:.1f} |")
    for name, tries in requests.items():
        outside = [t - sum(one.values()) for t, one in zip(times[name], tries, strict=True)]
        medians[name]["outside"] = statistics.median(outside) * 1000
    print(f"| (outside the requests: Python) | {medians['GpuStepOperator']['outside']:.1f} | "
          f"{medians['DockerOperator']['outside']:.1f} |")  # fmt: skip
    spread = {
        name: f"{statistics.median(t) * 1000:.1f} ({min(t) * 1000:.0f}-{max(t) * 1000:.0f})"
        for name, t in times.items()
    }
    print(f"| whole try (min-max) | {spread['GpuStepOperator']} | {spread['DockerOperator']} |")
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
        """From the build's start to the installer's last output line: the install container's time, without the
        engine committing the new layer afterwards (the same work for both installers)."""
        start = max(i for i, (_, line) in enumerate(self.lines) if line.startswith("Building derived image"))
        done = next(i for i in range(start + 1, len(self.lines)) if self.lines[i][1].startswith("Built derived"))
        return self.lines[done - 1][0] - self.lines[start][0]


def classic_build(client, spec, tag: str) -> float:
    """Seconds for the engine's classic builder to make ``spec`` (uv from the worker) from a Dockerfile, no cache."""
    import io
    import json
    import tarfile

    environment = " ".join(f"{name}={value}" for name, value in spec.steps.environment)
    dockerfile = f"FROM {spec.parent}\nCOPY uv /usr/local/bin/uv\nENV {environment}\n"
    dockerfile += f"RUN {json.dumps(spec.steps.entrypoint())}\n"
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile.encode())
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
        tar.add(spec.uv_binary, arcname="uv")
    context.seek(0)
    started = time.perf_counter()
    for chunk in client.build(fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True, nocache=True,
                              decode=True):  # fmt: skip
        if "error" in chunk:
            raise RuntimeError(chunk["error"])
    return time.perf_counter() - started


def timed_build(
    client, base_image: str, installer: str, requirements: list[str], *, cold: bool
) -> tuple[float, float, str, bool]:
    """Seconds for the whole build and for the install step alone, the image built, whether it reused another.

    :param cold: build from the parent with no layer cache; else as a task does (``ensure_derived_image``), which
        builds on a derived image of the same recipe when there is one
    """
    import tempfile

    from uv import find_uv_bin

    from airflow_gpu_provider.backends.docker.images.engine import build_image, ensure_derived_image
    from airflow_gpu_provider.backends.docker.images.spec import BuildOptions, derived_image_spec
    from airflow_gpu_provider.settings import ImageSettings

    image = ImageSettings(parent_image=base_image, requirements=requirements, python_package_installer=installer)
    spec = derived_image_spec(base_image, image, BuildOptions(repository=REPOSITORY), uv_binary=find_uv_bin())
    parent_id = client.inspect_image(base_image)["Id"]
    log = logging.getLogger(f"bench.build.{installer}.{cold}")
    timeline = Timeline()
    log.handlers, log.propagate = [timeline], False
    log.setLevel(logging.INFO)
    started = time.perf_counter()
    if cold:
        tag = spec.tag_for(parent_id)
        build_image(client, spec, tag, log, parent_id=parent_id)  # labelled: a base for the rebuilds
    else:
        with tempfile.TemporaryDirectory() as locks:
            tag, _ = ensure_derived_image(client, spec, parent_id, lock_dir=locks, push=False, log=log)
    whole = time.perf_counter() - started
    reused = any(line.startswith("Building on ") for _, line in timeline.lines)
    return whole, timeline.install_seconds(), tag, reused


def build_rows(client, base_image: str, builds: int) -> list[tuple[str, str, str]]:
    """Part 3, ``builds`` rounds (pip and uv take turns going first); every image built is removed."""
    from uv import find_uv_bin

    from airflow_gpu_provider.backends.docker.images.spec import BuildOptions, derived_image_spec
    from airflow_gpu_provider.settings import ImageSettings

    times: dict[str, list[tuple[float, float]]] = {"pip": [], "uv": [], "classic": [], **{n: [] for n in CHANGED}}
    image = ImageSettings(parent_image=base_image, requirements=BUILD_REQUIREMENTS)
    uv_spec = derived_image_spec(base_image, image, BuildOptions(repository=REPOSITORY), uv_binary=find_uv_bin())
    for round_ in range(builds):
        made = []
        try:
            for installer in ("pip", "uv", "classic") if round_ % 2 == 0 else ("classic", "uv", "pip"):
                if installer == "classic":  # the same uv recipe through the engine's builder
                    made.append(f"{REPOSITORY}:classic")
                    times["classic"].append((classic_build(client, uv_spec, made[-1]), 0.0))
                    continue
                whole, install, tag, _ = timed_build(client, base_image, installer, BUILD_REQUIREMENTS, cold=True)
                times[installer].append((whole, install))
                made.append(tag)
            for name, requirements in CHANGED.items():
                whole, install, tag, reused = timed_build(client, base_image, "uv", requirements, cold=False)
                if not reused:
                    raise RuntimeError(f"{name}: the rebuild did not reuse the cold uv image")
                times[name].append((whole, install))
                made.insert(0, tag)  # removed before the image it is built on
        finally:
            for tag in made:
                client.remove_image(tag, force=True)
        print(f"round {round_ + 1}: { ({k: [round(w, 1) for w, _ in v] for k, v in times.items()}) }", file=sys.stderr)

    def median(name: str, part: int) -> float:
        return statistics.median(t[part] for t in times[name])

    def spread(name: str) -> str:
        return f"{median(name, 0):.1f}s ({min(t[0] for t in times[name]):.1f}–{max(t[0] for t in times[name]):.1f})"

    rows = [
        ("derived build, cold: pip / uv, whole build", f"{spread('pip')} / {spread('uv')} = "
         f"{median('pip', 0) / median('uv', 0):.1f}x", ">= 3x"),
        ("derived build, cold: pip / uv, install step", f"{median('pip', 1):.1f}s / {median('uv', 1):.1f}s = "
         f"{median('pip', 1) / median('uv', 1):.1f}x", ">= 3x"),
        ("derived build, cold uv: committed install container / classic builder", f"{spread('uv')} / "
         f"{spread('classic')} = {median('uv', 0) / median('classic', 0):.2f}x", "<= 1.0x"),
    ]  # fmt: skip
    for name in CHANGED:
        share = median(name, 0) / median("uv", 0)
        rows.append((f"rebuild, {name} (uv, reusing the cold uv image)", f"{spread(name)} = {share:.2f} of cold uv",
                     "<= 0.33"))  # fmt: skip
    return rows


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
                "<= 1.1x",
            )
        )
        rows.append(("re-run, same requirements: rebuilds", str(rebuilds), "0"))
        rows.append(("re-run, same requirements: cache check (slowest of 5)", f"{slowest * 1000:.0f} ms", "< 1 s"))
        if not args.skip_builds:
            rows += build_rows(client, args.base_image, args.builds)
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
