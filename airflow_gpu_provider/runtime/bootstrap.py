"""Runtime of a GPU task: runs inside the child process, container or pod. Standard library only.

It is shipped as this one file, so any image with ``python3`` can run it::

    python3 bootstrap.py ENVELOPE RESULT

``ENVELOPE`` is a JSON file path, or ``env:NAME`` for base64 JSON in an environment variable. ``RESULT`` is the
path of the JSON result envelope (``-`` for none). The envelope (one wire format for every backend)::

    {"version": 1, "mode": "callable", "function": "train", "source": "def train(...): ...",
     "filename": "/dags/demo.py", "first_line": 12, "args": [...], "kwargs": {...},
     "summary": {"backend": "local", "image": "...", "requirements_hash": "...", "resources": "...",
                 "gpus": [{"index": "0", "name": "...", "memory_total": 85899345920}] | null},
     "clear_cache": true}

    {"version": 1, "mode": "command", "command": ["python", "train.py"], "summary": {...}}

The result envelope: ``{"ok": true, "return_value": ..., "cache": [...]}`` or
``{"ok": false, "error": {"type": ..., "message": ..., "traceback": ...}}``. Exit status 0 on success,
1 when the user code raised, 2 when the envelope itself is unusable.

The CUDA helpers (:func:`clear_cuda_cache`, :func:`list_gpus`, :func:`cuda_memory_stats`) are also what
``CudaHook`` and the worker's GPU inventory call, so there is one implementation of each.
"""

from __future__ import annotations
import __future__

import base64
import gc
import json
import linecache
import os
import sys
import time
import traceback
from typing import Any

ENVELOPE_VERSION = 1
PREFIX = "[gpu]"
EXIT_USER_ERROR = 1
EXIT_BAD_ENVELOPE = 2
RANK_PROCESS = "AIRFLOW_GPU_RANK_PROCESS"  # set for the processes a launcher (accelerate) starts
RESULT_TO_LOG = "AIRFLOW_GPU_RESULT_TO_LOG"  # also print the result as the last log line (no file can travel back)
RESULT_MARKER = f"{PREFIX} result: "


# --------------------------------------------------------------------------------------------- CUDA helpers
def _loaded_torch(import_torch: bool) -> Any:
    """Return the torch module if it is loaded (or may be imported), else None. Never imports it otherwise."""
    if "torch" in sys.modules:
        return sys.modules["torch"]
    if not import_torch:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch


def _reserved_bytes(torch: Any) -> int:
    return sum(torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count()))


def clear_cuda_cache(import_torch: bool = False) -> dict[str, Any]:
    """Free cached GPU memory: ``gc.collect()`` until nothing is left, then ``empty_cache`` and ``ipc_collect``.

    As ZenML's ``cleanup_memory``, but reports what it did. torch is used only if it is already loaded in this
    process (or ``import_torch`` is true): a process that never loaded torch holds no CUDA cache.

    :return: ``{"status": "cleared"|"skipped", "reason": str, "freed_bytes": int, "gc_rounds": int}``
    """
    rounds = 0
    while rounds < 10:
        rounds += 1
        if gc.collect() == 0:
            break
    torch = _loaded_torch(import_torch)
    if torch is None:
        return {"status": "skipped", "reason": "torch is not loaded", "freed_bytes": 0, "gc_rounds": rounds}
    if not torch.cuda.is_available():
        return {"status": "skipped", "reason": "CUDA is not available", "freed_bytes": 0, "gc_rounds": rounds}
    if not torch.cuda.is_initialized():
        return {
            "status": "skipped",
            "reason": "CUDA was never initialised in this process",
            "freed_bytes": 0,
            "gc_rounds": rounds,
        }
    before = _reserved_bytes(torch)
    torch.cuda.empty_cache()
    torch.cuda.ipc_collect()
    freed = max(0, before - _reserved_bytes(torch))
    return {"status": "cleared", "reason": "", "freed_bytes": freed, "gc_rounds": rounds}


def cuda_memory_stats() -> list[dict[str, Any]]:
    """Per-device memory of this process (torch, if loaded and CUDA initialised), else of the device (NVML)."""
    torch = _loaded_torch(False)
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return [
            {
                "index": str(i),
                "name": torch.cuda.get_device_name(i),
                "allocated": torch.cuda.memory_allocated(i),
                "reserved": torch.cuda.memory_reserved(i),
                "total": torch.cuda.get_device_properties(i).total_memory,
            }
            for i in range(torch.cuda.device_count())
        ]
    return [
        {"index": g["index"], "name": g["name"], "used": g.get("memory_used"), "total": g["memory_total"]}
        for g in list_gpus()
    ]


def _nvml_gpus() -> list[dict[str, Any]] | None:
    try:
        import pynvml  # from nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                {
                    "index": str(i),
                    "uuid": pynvml.nvmlDeviceGetUUID(handle),
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_total": int(memory.total),
                    "memory_used": int(memory.used),
                }
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _nvidia_smi_gpus() -> list[dict[str, Any]] | None:
    import shutil  # here, not at the top: every task start (and every container start) pays for top-level imports
    import subprocess

    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    query = "--query-gpu=index,uuid,name,memory.total,memory.used"
    try:
        out = subprocess.run(
            [binary, query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 5:
            index, uuid, name, total, used = fields
            gpus.append(
                {
                    "index": index,
                    "uuid": uuid,
                    "name": name,
                    "memory_total": int(float(total)) * 2**20,
                    "memory_used": int(float(used)) * 2**20,
                }
            )
    return gpus


def list_gpus() -> list[dict[str, Any]]:
    """NVIDIA GPUs visible to this process: NVML (nvidia-ml-py) if importable, else ``nvidia-smi``, else none."""
    for probe in (_nvml_gpus, _nvidia_smi_gpus):
        gpus = probe()
        if gpus is not None:
            return gpus
    return []


# --------------------------------------------------------------------------------------------- summary
def _format_bytes(amount: float | None) -> str:
    if amount is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024:
            return f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} TiB"


def _describe_cache(result: dict[str, Any]) -> str:
    if result["status"] == "cleared":
        return f"cleared, {_format_bytes(result['freed_bytes'])} freed"
    return f"skipped ({result['reason']})"


def print_summary(summary: dict[str, Any], cache: dict[str, Any]) -> None:
    """Print the resource summary that starts every GPU task's log."""
    gpus = summary.get("gpus")
    if gpus is None:  # containers and pods: ask the device itself
        gpus = list_gpus()
    if gpus:
        gpu_text = "; ".join(f"{g['index']}: {g['name']} ({_format_bytes(g.get('memory_total'))})" for g in gpus)
    else:
        gpu_text = "none (running on CPU)"
    lines = [
        f"backend={summary.get('backend')} image={summary.get('image')} "
        f"requirements={summary.get('requirements_hash')}",
        f"resources: {summary.get('resources')}",
        f"GPUs assigned: {gpu_text}",
        f"CUDA cache before task: {_describe_cache(cache)}",
    ]
    for line in lines:
        print(f"{PREFIX} {line}", flush=True)


# --------------------------------------------------------------------------------------------- execution
def _load_envelope(source: str) -> dict[str, Any]:
    if source.startswith("env:"):
        raw = base64.b64decode(os.environ[source[4:]]).decode()
    else:
        with open(source, encoding="utf-8") as handle:
            raw = handle.read()
    envelope = json.loads(raw)
    if envelope.get("version") != ENVELOPE_VERSION:
        raise ValueError(f"envelope version {envelope.get('version')!r}, this runtime reads {ENVELOPE_VERSION}")
    return envelope


def _load_function(envelope: dict[str, Any]) -> Any:
    """Compile the shipped source so that tracebacks show the DAG file's own line numbers."""
    filename = envelope.get("filename") or "<gpu task>"
    padded = "\n" * (int(envelope.get("first_line", 1)) - 1) + envelope["source"]
    linecache.cache[filename] = (len(padded), None, padded.splitlines(True), filename)
    code = compile(padded, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace: dict[str, Any] = {"__name__": "__gpu_task__", "__file__": filename}
    exec(code, namespace)  # noqa: S102 - running the task's own function is the point
    return namespace[envelope["function"]]


def _write_result(path: str, result: dict[str, Any]) -> None:
    if os.environ.get(RANK_PROCESS):  # launched by this runtime: every rank reports, the launcher merges
        path = f"{path}.rank{os.environ.get('RANK', '0')}" if path != "-" else path
    elif os.environ.get("RANK", "0") != "0":
        return
    elif os.environ.get(RESULT_TO_LOG):
        print(RESULT_MARKER + json.dumps(result), flush=True)
    if path == "-":
        return
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    os.replace(tmp, path)


def _error(exc: BaseException) -> dict[str, Any]:
    return {
        "time": time.time(),  # the earliest error of several ranks is the root cause
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the worker that started it dies (best effort)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


# --------------------------------------------------------------------------------------------- launchers
def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def launch_command(envelope: dict[str, Any], source: str, result_path: str, environ: dict[str, str]) -> list[str]:
    """The launcher's argv, e.g. ``python -m accelerate.commands.launch <args> bootstrap.py ENVELOPE RESULT``.

    ``launch`` in the envelope: ``module``, ``args``, ``from_environment`` (flag -> variable, e.g. the node rank
    of a multi-node pod) and ``free_port_flag`` (a flag that gets a free local port when it is not in ``args``).
    """
    launch = envelope["launch"]
    argv = [sys.executable, "-m", launch["module"], *[str(a) for a in launch["args"]]]
    for flag, variable in (launch.get("from_environment") or {}).items():
        argv += [flag, environ[variable]]
    port_flag = launch.get("free_port_flag")
    if port_flag and port_flag not in argv:
        argv += [port_flag, str(_free_port())]
    if envelope["mode"] == "callable":
        return [*argv, os.path.abspath(__file__), source, result_path]
    return [*argv, *[str(part) for part in envelope["command"]]]


def _rank_results(result_path: str) -> dict[int, dict[str, Any]]:
    directory, prefix = os.path.split(os.path.abspath(result_path))
    results = {}
    for name in os.listdir(directory or "."):
        if name.startswith(f"{prefix}.rank") and name[len(prefix) + 5 :].isdigit():
            path = os.path.join(directory, name)
            with open(path, encoding="utf-8") as handle:
                results[int(name[len(prefix) + 5 :])] = json.load(handle)
            os.remove(path)
    return results


def _run_launcher(envelope: dict[str, Any], source: str, result_path: str) -> int:
    """Run the payload under a launcher; the launched ranks run it, rank 0's result (or the first error) wins."""
    import signal
    import subprocess

    environ = {**os.environ, **(envelope["launch"].get("environment") or {}), RANK_PROCESS: "1"}
    gpus = (envelope.get("summary") or {}).get("gpus")
    if "ACCELERATE_USE_CPU" not in environ and (gpus == [] or (gpus is None and not list_gpus())):
        environ["ACCELERATE_USE_CPU"] = "1"  # no GPU: the same processes, on CPU with gloo
    argv = launch_command(envelope, source, result_path, environ)
    cpu_note = " (CPU: ACCELERATE_USE_CPU=1)" if environ.get("ACCELERATE_USE_CPU") else ""
    print(f"{PREFIX} launching{cpu_note}: {' '.join(argv)}", flush=True)
    if result_path != "-":
        _rank_results(result_path)  # leftovers of an earlier try
    process = subprocess.Popen(argv, env=environ)
    previous = signal.signal(signal.SIGTERM, lambda *_: process.terminate())  # e.g. docker stop on PID 1
    try:
        status = process.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if envelope["mode"] != "callable" or result_path == "-":
        return status
    results = _rank_results(result_path)
    errors = sorted((r["error"].get("time", 0), rank) for rank, r in results.items() if not r.get("ok"))
    if errors:
        rank = errors[0][1]
        failed = results[rank]
        failed["error"]["message"] = f"rank {rank}: {failed['error']['message']}"
        _write_result(result_path, failed)
        return EXIT_USER_ERROR
    if status == 0:  # rank 0's value; on the other machines of a multi-node run, rank 0 is elsewhere
        _write_result(result_path, {**results.get(0, {"ok": True, "return_value": None}), "ranks": len(results)})
        return 0
    message = (
        f"{envelope['launch']['module']} exited with status {status} and no rank reported an exception "
        "(a rank was killed, or the launcher itself failed): see the log above"
    )
    _write_result(result_path, {"ok": False, "error": {"type": "LaunchError", "message": message, "traceback": ""}})
    return status or EXIT_USER_ERROR


def run(envelope: dict[str, Any], result_path: str, source: str = "-") -> int:
    """Run one envelope (read from ``source``); return the process exit status."""
    rank_process = bool(os.environ.get(RANK_PROCESS))
    if envelope.get("die_with_parent") and not rank_process:
        _die_with_parent()
    clear = envelope.get("clear_cache", True)
    before = clear_cuda_cache() if clear else {"status": "skipped", "reason": "disabled", "freed_bytes": 0}
    if not rank_process:
        print_summary(envelope.get("summary") or {}, before)
        if envelope.get("launch"):
            return _run_launcher(envelope, source, result_path)

    if envelope["mode"] == "command":
        command = [str(part) for part in envelope["command"]]
        sys.stdout.flush()
        try:
            os.execvp(command[0], command)  # noqa: S606 - an argument list, no shell
        except OSError as exc:
            print(f"{PREFIX} cannot run {command[0]!r}: {exc}", file=sys.stderr, flush=True)
            _write_result(result_path, {"ok": False, "error": _error(exc)})
            return 127

    def fail(exc: BaseException) -> int:
        traceback.print_exc()
        sys.stderr.flush()
        after = clear_cuda_cache() if clear else before
        _write_result(result_path, {"ok": False, "error": _error(exc), "cache": [before, after]})
        return EXIT_USER_ERROR

    started = time.monotonic()
    try:
        function = _load_function(envelope)
        value = function(*envelope.get("args", []), **envelope.get("kwargs", {}))
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"the return value of {envelope['function']}() is a {type(value).__name__}, which cannot travel "
                "back as JSON; return None, bool, int, float, str, or lists/dicts of those"
            ) from exc
    except SystemExit as exc:  # sys.exit() in user code: 0/None is success
        if exc.code not in (0, None):
            return fail(exc)
        value = None
    except Exception as exc:  # noqa: BLE001 - everything the user code raises is reported
        return fail(exc)
    duration = time.monotonic() - started
    after = clear_cuda_cache() if clear else before
    who = f"rank {os.environ.get('RANK', '0')}: " if rank_process else ""
    print(
        f"{PREFIX} {who}{envelope['function']}() finished in {duration:.2f}s; CUDA cache after task: "
        f"{_describe_cache(after)}",
        flush=True,
    )
    _write_result(result_path, {"ok": True, "return_value": value, "cache": [before, after], "duration_s": duration})
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: ``bootstrap.py ENVELOPE RESULT``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: bootstrap.py ENVELOPE RESULT", file=sys.stderr)
        return EXIT_BAD_ENVELOPE
    try:
        envelope = _load_envelope(argv[0])
    except (OSError, KeyError, ValueError) as exc:
        print(f"{PREFIX} unusable task envelope {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        _write_result(argv[1], {"ok": False, "error": _error(exc)})
        return EXIT_BAD_ENVELOPE
    return run(envelope, argv[1], argv[0])


if __name__ == "__main__":
    sys.exit(main())
