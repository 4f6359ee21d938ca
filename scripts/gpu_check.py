"""Verify the provider's GPU paths for real on this machine's NVIDIA GPUs, and print a table of the results.

    make gpu-check                  # or: .venv/bin/python scripts/gpu_check.py [--only CHECK,...] [--list]

Each check runs the provider's own code (its inventory, its host allocator, its local backend, its CUDA cache
clearing, the example DAGs through ``dag.test()``), never a re-implementation of it:

=============  ====================================================================================================
inventory      the provider's host inventory (NVML) is nvidia-smi's list: index, UUID, name and memory of every GPU
allocator      the host allocator hands out real GPUs (NVML UUIDs), never the same one twice, and frees them after
local-task     a local-backend task sees exactly its GPU: CUDA_VISIBLE_DEVICES is the allocated one,
               torch.cuda.device_count() is 1, and the UUID torch reports is the allocated GPU's
cuda-cache     in such a task, CudaHook().clear_cache(), the cache listener and the runtime's clear after the task
               each bring torch.cuda.memory_reserved() back to 0
demo-bf16      the demo DAG (dags/gpu_training_demo.py) trains on cuda with bf16 autocast (its forward pass computes
               in bfloat16) and its loss goes down
profile        the demo's train task comes back with a GPU profile (NVML through ctypes): its samples, utilisation,
               peak memory and energy, the real figures of this card
accelerate     a 1-GPU launch of dags/accelerate_training.py (AccelerateOperator): accelerate launch with one
               process, world size 1, device cuda
oom            a real CUDA out-of-memory error is a gpu_oom that names the GPU's memory; the next try gets a larger GPU
shares         two tasks of half a GPU at once share one GPU, each refused 65 % of it (CUDA OOM) and given 35 %:
               enforced by MPS where the host has it (the provider starts its daemon), else by PyTorch's cap
share-throughput  the same small workload as two shares at once and as two whole-GPU tasks in turn: the makespans
=============  ====================================================================================================

Exit status: 0 when every check passed, 1 when one failed, 2 when this machine has no NVIDIA GPU (nothing is checked
then: nothing is faked) or the arguments are wrong. Each check's output (task logs included) is kept under
``--log-dir``; the tail of a failed check's log is printed after the table.

The inventory is NVML's (``[gpu] devices = auto``) for this run, whatever ``AIRFLOW__GPU__DEVICES`` says; the GPU
locks are the host's (``[gpu] state_dir``), so GPUs that running tasks hold are reported busy, not taken.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks import add_selection, format_table, list_checks, selected  # scripts/, this script's folder
from gpu_check_shares import (
    ShareCheckError,
    enforcement,
    one_after_the_other,
    probe_share,
    two_at_once,
    verdict_shares,
    verdict_throughput,
)
from redirect import output_to

from airflow_gpu_provider.config.worker import GpuConfig

REPO = Path(__file__).resolve().parents[1]
EXIT_FAILED = 1
EXIT_NO_GPU = 2
CACHE_BLOCK_MIB = 256


# ---------------------------------------------------------------------------------------- what runs in the tasks
# These functions are shipped to local-backend task processes as source (they import what they use inside).
def probe_visible_gpu() -> dict:
    """What a task process sees: its visible devices, and the GPU torch finds."""
    import os

    import torch

    found = torch.cuda.is_available()
    properties = torch.cuda.get_device_properties(0) if found else None
    return {
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device_order": os.environ.get("CUDA_DEVICE_ORDER"),
        "device_count": torch.cuda.device_count() if found else 0,
        "uuid": str(properties.uuid) if properties is not None else None,
        "name": properties.name if properties is not None else None,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    }


def probe_cuda_cache(mebibytes: int) -> dict:
    """Fill the CUDA cache and clear it with the provider's hook, then its listener; leave one for the runtime."""
    import torch

    from airflow_gpu_provider.hooks import cuda_cache
    from airflow_gpu_provider.hooks.cuda import CudaHook

    if not torch.cuda.is_available():
        return {"error": f"torch {torch.__version__} sees no CUDA device (torch.version.cuda={torch.version.cuda})"}
    report: dict = {}
    for step in ("hook", "listener", "runtime"):
        block = torch.empty(mebibytes * 2**20, dtype=torch.uint8, device="cuda")
        del block  # freed, but kept reserved by the caching allocator
        report[f"{step}_held"] = torch.cuda.memory_reserved()
        if step == "hook":
            report["hook_result"] = CudaHook().clear_cache()
        elif step == "listener":
            cuda_cache.on_task_instance_success(None, None)
        else:
            break  # the runtime clears this one after the function returns, and logs it
        report[f"{step}_after"] = torch.cuda.memory_reserved()
    return report


# ---------------------------------------------------------------------------------------------- the checks
@dataclass
class Context:
    """What every check gets: the GPUs NVML lists (through the provider), a logger, where logs go."""

    gpus: list[dict[str, Any]]
    log: logging.Logger
    log_file: Path
    epochs: int
    records: list[logging.LogRecord] = field(default_factory=list)


class Failed(Exception):
    """A check found the GPU path broken; the message says how."""


def _labels(task_id: str) -> dict[str, str]:
    return {"dag_id": "gpu_check", "task_id": task_id, "run_id": f"gpu-check-{int(time.time())}", "try_number": "1"}


def _nvidia_smi() -> list[list[str]]:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        raise Failed("nvidia-smi is not on the PATH: nothing independent to compare the inventory with")
    out = subprocess.run(
        [binary, "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]


def check_inventory(ctx: Context) -> str:
    """The provider's NVML inventory against nvidia-smi."""
    from airflow_gpu_provider.host.inventory import host_devices

    devices = host_devices("auto")
    rows = _nvidia_smi()
    mine = [(d.id, d.name) for d in devices]
    theirs = [(row[1], row[2]) for row in rows]
    if mine != theirs:
        raise Failed(f"the provider lists {mine}, nvidia-smi {theirs}")
    for device, row in zip(devices, rows, strict=True):
        if device.memory_total is None or abs(device.memory_total / 2**20 - int(row[3])) > 1:
            raise Failed(f"{device.id}: {device.memory_total} bytes by the provider, {row[3]} MiB by nvidia-smi")
    names = sorted({d.name or "?" for d in devices})
    return f"{len(devices)} GPU(s), {', '.join(names)}: UUIDs, names and memory match nvidia-smi"


def check_allocator(ctx: Context) -> str:
    """Real devices from the host allocator, exclusive, released."""
    from airflow_gpu_provider.exceptions import GpuUnavailableError
    from airflow_gpu_provider.host.allocator import GpuAllocator, HostGpus
    from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
    from airflow_gpu_provider.task.envelope import Envelope
    from airflow_gpu_provider.task.request import TaskRequest

    host = HostGpus.configured(GpuConfig.read())  # [gpu] devices = auto (main)
    uuids = [g["uuid"] for g in ctx.gpus]

    def request(count: int, task_id: str) -> TaskRequest:
        resources = ResourceSettings(gpu_count=count)
        return TaskRequest(resources, ImageSettings(), Envelope.run(["true"]), "fail", _labels(task_id))

    locks = GpuAllocator(Path(host.state_dir) / "locks")
    with host.allocate(request(1, "first"), backend="gpu-check", log=ctx.log) as first:
        (device,) = first.devices
        if device.id not in uuids:
            raise Failed(f"the allocator gave {device.id!r}, which is not one of NVML's GPUs {uuids}")
        if locks.holder_of(device) is None:
            raise Failed(f"{device.id} was given out but its lock is not held")
        rest = len(uuids) - 1
        if rest:
            with host.allocate(request(rest, "rest"), backend="gpu-check", log=ctx.log) as second:
                if device in second.devices or len(second.devices) != rest:
                    raise Failed(f"while {device.id} was held, a request for {rest} got {second.devices}")
        try:
            with host.allocate(request(len(uuids), "all"), backend="gpu-check", log=ctx.log):
                raise Failed(f"a request for all {len(uuids)} GPU(s) succeeded while {device.id} was held")
        except GpuUnavailableError:
            pass  # the held GPU is not handed out twice
    if locks.holder_of(device) is not None:
        raise Failed(f"{device.id} is still locked after its allocation was released")
    return f"gave {device.id}, never twice (state dir {host.state_dir}), released it"


def _run_local_task(
    ctx: Context, function: Callable[..., Any], *args: Any, min_gpu_memory: int | None = None, gpus: float = 1
) -> tuple[Any, list[str]]:
    """Run a function as a local-backend task of ``gpus`` GPUs (a share below 1); its value and the GPUs given."""
    from airflow_gpu_provider.backends import BACKENDS
    from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
    from airflow_gpu_provider.task.callable import shipped_callable
    from airflow_gpu_provider.task.envelope import Envelope
    from airflow_gpu_provider.task.request import TaskRequest

    backend = BACKENDS["local"].create({}, log=ctx.log)  # the host's GPUs: [gpu] devices = auto (main)
    envelope = Envelope.call(shipped_callable(function, owner="gpu_check"), list(args), {})
    request = TaskRequest(
        ResourceSettings(gpu_count=gpus),
        ImageSettings(),
        envelope,
        "fail",
        _labels(function.__name__),
        min_gpu_memory=min_gpu_memory,
    )
    first = len(ctx.records)
    value = backend.run(backend.plan(request, GpuConfig.read()), {}).return_value
    # the backend logs the GPUs it gave the task: "Starting task process on GPUs %s" with the list of ids
    given: list[str] = []
    for record in ctx.records[first:]:
        if record.msg == "Starting task process on GPUs %s" and isinstance(record.args, tuple):
            ids = record.args[0]
            given = [str(i) for i in ids] if isinstance(ids, list) else []
    return value, given


def _same_gpu(device_id: str, torch_uuid: str | None, gpus: Sequence[dict[str, Any]]) -> bool:
    """Whether the UUID torch reports (no ``GPU-`` prefix) is the GPU the allocator's id names."""
    if torch_uuid is None:
        return False
    by_index = {g["index"]: g["uuid"] for g in gpus}
    full = by_index.get(device_id, device_id)  # [gpu] devices may list indices
    return full.lower().split("-", 1)[-1] == torch_uuid.lower()


def check_local_task(ctx: Context) -> str:
    """CUDA_VISIBLE_DEVICES, device count and UUID seen by torch in a local-backend task."""
    seen, given = _run_local_task(ctx, probe_visible_gpu)
    if len(given) != 1:
        raise Failed(f"the local backend should have given 1 GPU, it gave {given}")
    if seen["cuda_visible_devices"] != given[0]:
        raise Failed(f"allocated {given[0]}, but the task saw CUDA_VISIBLE_DEVICES={seen['cuda_visible_devices']!r}")
    if seen["device_count"] != 1:
        raise Failed(
            f"torch {seen['torch']} (CUDA {seen['torch_cuda']}) in the task sees {seen['device_count']} device(s), "
            "expected exactly the allocated one"
        )
    if not _same_gpu(given[0], seen["uuid"], ctx.gpus):
        raise Failed(f"allocated {given[0]}, but torch's device 0 is GPU-{seen['uuid']}")
    return (
        f"CUDA_VISIBLE_DEVICES={given[0]} ({seen['device_order']}), torch.cuda.device_count()=1, "
        f"device 0 is that GPU ({seen['name']})"
    )


def check_cuda_cache(ctx: Context) -> str:
    """The provider's three cache clears, each back to memory_reserved() == 0."""
    from airflow_gpu_provider.settings.units import format_bytes

    first = len(ctx.records)
    report, _ = _run_local_task(ctx, probe_cuda_cache, CACHE_BLOCK_MIB)
    if "error" in report:
        raise Failed(report["error"])
    if report["hook_result"]["status"] != "cleared" or report["hook_after"] != 0:
        raise Failed(f"CudaHook().clear_cache() gave {report['hook_result']}, memory_reserved()={report['hook_after']}")
    if report["listener_after"] != 0:
        raise Failed(
            f"after the cache listener memory_reserved()={report['listener_after']} "
            "(is [gpu] clear_cache_between_tasks off?)"
        )
    expected = f"CUDA cache after task: cleared, {format_bytes(report['runtime_held'])} freed"
    lines = [r.getMessage() for r in ctx.records[first:]]
    if not any(expected in line for line in lines):
        found = [line for line in lines if "CUDA cache after task" in line]
        raise Failed(f"the runtime's clear after the task did not free the cache: expected {expected!r}, got {found}")
    return (
        f"{format_bytes(report['hook_held'])} reserved -> 0 by CudaHook, by the listener and by the runtime "
        "after the task"
    )


def _ensure_migrated() -> None:
    """dag.test() needs a migrated metadata DB: migrate $AIRFLOW_HOME once (the marker ``make demo`` uses)."""
    home = Path(os.environ["AIRFLOW_HOME"])
    marker = home / ".migrated"
    if marker.exists():
        return
    home.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise Failed(f"airflow db migrate failed: {(done.stdout + done.stderr)[-1000:]}")
    marker.touch()


def _run_example(file_name: str, dag_id: str, conf: dict[str, Any], task_id: str, key: str = "return_value") -> Any:
    if str(REPO / "scripts") not in sys.path:
        sys.path.insert(0, str(REPO / "scripts"))
    from demo import run_example, xcom  # what make demo runs

    _ensure_migrated()
    dag_run = run_example(file_name, dag_id, conf)
    if str(dag_run.state) != "success":
        raise Failed(f"{dag_id} run {dag_run.run_id} ended {dag_run.state}")
    return xcom(dag_run, task_id, key)


def check_demo_bf16(ctx: Context) -> str:
    """The demo DAG on one GPU with bf16 autocast."""
    conf = {"epochs": ctx.epochs, "gpu_count": 1, "mixed_precision": "bf16"}
    conf.update(backend="local", on_missing_gpu="fail")
    metrics = _run_example("gpu_training_demo.py", "gpu_training_demo", conf, "train")
    if not str(metrics.get("device", "")).startswith("cuda"):
        raise Failed(f"trained on {metrics.get('device')!r}, not cuda: {metrics}")
    if (metrics.get("mixed_precision"), metrics.get("compute_dtype")) != ("bf16", "bfloat16"):
        raise Failed(f"bf16 was asked for, but the forward pass computed in {metrics.get('compute_dtype')}: {metrics}")
    if not metrics["final_loss"] < metrics["initial_loss"]:
        raise Failed(f"the loss did not go down: {metrics}")
    return (
        f"{metrics['epochs']} epochs on {metrics['device']} ({metrics['gpu_name']}), forward in bfloat16, "
        f"loss {metrics['initial_loss']:.3f} -> {metrics['final_loss']:.3f}"
    )


def check_profile(ctx: Context) -> str:
    """The demo's train task profiled through NVML: a GPU profile in XCom with the card's real figures."""
    conf = {"epochs": ctx.epochs, "gpu_count": 1, "backend": "local", "on_missing_gpu": "fail"}
    profile = _run_example("gpu_training_demo.py", "gpu_training_demo", conf, "train", key="gpu_profile")
    if not profile or profile.get("kind") != "gpu":
        raise Failed(f"expected a GPU profile in XCom, got {profile and profile.get('kind')}: {profile}")
    device = profile["devices"][0]
    if not device.get("peak_memory") or device.get("mean_util") is None:
        raise Failed(f"the profile has no memory or utilisation figures: {device}")
    energy = "" if device.get("energy_wh") is None else f", {device['energy_wh']:.3f} Wh"
    return (
        f"{device['name']}: {profile['samples']} samples in {profile['duration_s']:.1f}s, utilisation mean "
        f"{device['mean_util']:.0f} % p95 {device['p95_util']:.0f} %, peak {device['peak_memory'] / 2**30:.2f} GiB "
        f"({device['peak_memory_pct']:.1f} %){energy}"
    )


def allocate_too_much() -> None:
    """Ask the GPU for more memory than it has: a real CUDA out-of-memory error."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    torch.empty(int(total * 1.5), dtype=torch.uint8, device="cuda")


def check_oom(ctx: Context) -> str:
    """A real CUDA OOM is a gpu_oom with the GPU's memory; the next try needs a larger GPU (on_oom escalation)."""
    from airflow_gpu_provider.escalation import tries as escalation
    from airflow_gpu_provider.exceptions import GpuOutOfMemoryError, GpuUnavailableError
    from airflow_gpu_provider.settings import ResourceSettings

    try:
        _run_local_task(ctx, allocate_too_much)
    except GpuOutOfMemoryError as err:
        entry = escalation.record(1, ResourceSettings(gpu_count=1), err)
    else:
        raise Failed("allocating 1.5x the GPU's memory did not fail")
    if not entry.get("gpu_memory"):
        raise Failed(f"the failed try does not say its GPU's memory: {entry}")
    larger = [g for g in ctx.gpus if (g.get("memory_total") or 0) > entry["gpu_memory"]]
    try:
        _, given = _run_local_task(ctx, probe_visible_gpu, min_gpu_memory=entry["gpu_memory"])
    except GpuUnavailableError as unavailable:
        if larger:
            raise Failed(f"this host has a larger GPU ({larger[0]['name']}) but: {unavailable}") from None
        return f"gpu_oom on {entry['gpu_model']} ({entry['gpu_memory'] / 2**30:.1f} GiB); no larger GPU here, said so"
    return f"gpu_oom on {entry['gpu_model']}; the next try got larger GPU {given}"


def check_accelerate(ctx: Context) -> str:
    """A 1-GPU accelerate launch through AccelerateOperator (the example DAG)."""
    conf = {"epochs": 2, "gpu_count": 1, "mixed_precision": "no", "backend": "local", "on_missing_gpu": "fail"}
    result = _run_example("accelerate_training.py", "accelerate_training", conf, "train")
    if result.get("world_size") != 1 or not str(result.get("device", "")).startswith("cuda"):
        raise Failed(f"expected world size 1 on cuda, the rank saw {result}")
    sys.stdout.flush()  # the task log went to this check's log file (output_to)
    sys.stderr.flush()
    launched = [line for line in ctx.log_file.read_text(errors="replace").splitlines() if "[gpu] launching" in line]
    if not launched or "accelerate.commands.launch" not in launched[-1] or "(CPU:" in launched[-1]:
        raise Failed(f"the task did not go through accelerate launch on the GPU: {launched}")
    if "--num_processes 1" not in launched[-1]:
        raise Failed(f"expected one process: {launched[-1]}")
    return f"accelerate launch --num_processes 1: world size 1 on {result['device']}"


def _share_task(ctx: Context, share: float) -> dict:
    from gpu_check_shares import MARGIN, WORK

    return dict(_run_local_task(ctx, probe_share, share, MARGIN, WORK, gpus=share)[0])


def _said(ctx: Context, first: int) -> list[str]:
    return [record.getMessage() for record in ctx.records[first:] if "a share of " in record.getMessage()]


def check_shares(ctx: Context) -> str:
    """Two shares of one GPU at once, each held to its share: MPS where the host has it, else PyTorch's cap."""
    first = len(ctx.records)
    try:
        reports, _ = two_at_once(lambda share: _share_task(ctx, share))
        return verdict_shares(reports, _said(ctx, first))
    except ShareCheckError as err:
        raise Failed(str(err)) from None


def check_share_throughput(ctx: Context) -> str:
    """Two small tasks as shares at once vs whole-GPU tasks one after the other: the makespans."""
    first = len(ctx.records)
    try:
        _, shared = two_at_once(lambda share: _share_task(ctx, share))
        how = enforcement(_said(ctx, first))
        _, in_turn = one_after_the_other(lambda share: _share_task(ctx, share))
        return verdict_throughput(shared, in_turn, how)
    except ShareCheckError as err:
        raise Failed(str(err)) from None


CHECKS: dict[str, Callable[[Context], str]] = {
    "inventory": check_inventory,
    "allocator": check_allocator,
    "local-task": check_local_task,
    "cuda-cache": check_cuda_cache,
    "demo-bf16": check_demo_bf16,
    "profile": check_profile,
    "accelerate": check_accelerate,
    "oom": check_oom,
    "shares": check_shares,
    "share-throughput": check_share_throughput,
}


# ------------------------------------------------------------------------------------------------ running them
def find_gpus() -> tuple[list[dict[str, Any]], str]:
    """The NVIDIA GPUs of this machine as the provider lists them (NVML, else nvidia-smi), and why there are none."""
    from airflow_gpu_provider.runtime.cuda import list_gpus

    gpus = list_gpus()
    if gpus:
        return gpus, ""
    reasons = []
    try:
        import pynvml
    except ImportError:
        reasons.append("NVML: nvidia-ml-py is not installed")
    else:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            reasons.append(f"NVML: {err}")
        else:
            pynvml.nvmlShutdown()
            reasons.append("NVML: no device")
    reasons.append("nvidia-smi: not on the PATH" if shutil.which("nvidia-smi") is None else "nvidia-smi: no GPU")
    return [], "; ".join(reasons)


class _Records(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def run_check(name: str, gpus: list[dict[str, Any]], log_dir: Path, epochs: int) -> tuple[bool, str]:
    """Run one check with its output in ``log_dir/NAME.log``; return (passed, detail)."""
    log_file = log_dir / f"{name}.log"
    log_file.write_text("")
    log = logging.getLogger(f"gpu_check.{name}")
    log.setLevel(logging.INFO)
    log.propagate = False
    ctx = Context(gpus=gpus, log=log, log_file=log_file, epochs=epochs)
    handlers = [_Records(ctx.records), logging.FileHandler(log_file)]
    for handler in handlers:
        log.addHandler(handler)
    try:
        with output_to(log_file, append=True):
            return True, CHECKS[name](ctx)
    except Failed as err:
        return False, str(err)
    except Exception as err:  # noqa: BLE001 - any error of the provider's code is a failed check, named
        return False, f"{type(err).__name__}: {err}"
    finally:
        for handler in handlers:
            log.removeHandler(handler)
            handler.close()


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (``--help`` describes it)."""
    parser = argparse.ArgumentParser(
        prog="gpu_check.py",
        description="Verify the provider's GPU paths on this machine's NVIDIA GPUs and print a table.",
        epilog="Checks: " + ", ".join(CHECKS) + ". Exit status: 0 all passed, 1 a check failed, 2 no GPU.",
    )
    add_selection(parser, CHECKS)
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the demo DAG (default 3)")
    parser.add_argument("--log-dir", type=Path, help="where each check's log goes (default $AIRFLOW_HOME/gpu-check)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks; the exit status says whether they all passed."""
    arguments = parse_arguments(argv)
    if arguments.list:
        list_checks(CHECKS)
        return 0
    os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".airflow-home"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO / "dags"))
    gpus, why = find_gpus()
    if not gpus:
        print(
            f"gpu-check: no NVIDIA GPU on this machine ({why}).\n"
            "Nothing was checked: gpu-check runs the provider's GPU paths on real GPUs. Run it on a machine with an "
            "NVIDIA GPU and its driver (nvidia-smi lists the GPUs there).",
            file=sys.stderr,
        )
        return EXIT_NO_GPU
    configured = os.environ.get("AIRFLOW__GPU__DEVICES")
    os.environ["AIRFLOW__GPU__DEVICES"] = "auto"  # the NVML inventory, for the example DAGs too
    names = selected(arguments, CHECKS)
    log_dir = arguments.log_dir or Path(os.environ["AIRFLOW_HOME"]) / "gpu-check"
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"gpu-check: {len(gpus)} GPU(s): " + "; ".join(f"{g['index']}: {g['name']} {g['uuid']}" for g in gpus))
    if configured not in (None, "auto"):
        print(f"gpu-check: AIRFLOW__GPU__DEVICES={configured} is replaced by 'auto' (NVML) for these checks")
    rows = []
    for name in names:
        print(f"gpu-check: {name} ...", flush=True)
        started = time.monotonic()
        passed, detail = run_check(name, gpus, log_dir, arguments.epochs)
        rows.append((name, "PASS" if passed else "FAIL", f"{detail} [{time.monotonic() - started:.1f}s]"))
    print()
    print(format_table(rows))
    failed = [name for name, result, _ in rows if result != "PASS"]
    for name in failed:
        tail = (log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-25:]
        print(f"\n--- {name}: last lines of {log_dir / f'{name}.log'}\n" + "\n".join(tail))
    print(f"\ngpu-check: {len(rows) - len(failed)}/{len(rows)} passed; logs in {log_dir}")
    return EXIT_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
