"""Runtime of a GPU task: runs inside the child process, container or pod. Standard library only.

It is shipped as this one file, so any image with ``python3`` can run it. It owns the wire protocol between a
backend and the task process (envelope version 2)::

    python3 bootstrap.py ENVELOPE RESULT               the task process
    python3 bootstrap.py ENVELOPE --rank-results DIR    one rank of a launch (started by this runtime itself)

``ENVELOPE`` is a JSON file path, or ``env:NAME`` for base64 JSON in an environment variable. ``RESULT`` is where
the result envelope goes: a file path, or ``-`` to print it as the last log line (``[gpu] result: {...}``) where no
file can travel back (a multi-node Kubernetes run). It is a command-line argument, not part of the envelope, so that
a runtime that cannot read its envelope still reports why. The envelope::

    {"version": 2, "mode": "callable", "function": "train", "source": "def train(...): ...",
     "filename": "/dags/demo.py", "first_line": 12, "args": [...], "kwargs": {...}, "clear_cache": true,
     "summary": {"backend": "local", "image": "...", "requirements_hash": "...", "resources": "...",
                 "gpus": [{"index": "0", "name": "...", "memory_total": 85899345920}] | null},
     "die_with_parent": false,
     "launch": {"module": "accelerate.commands.launch", "args": ["--num_processes", "2", ...],
                "environment": {...}, "cpu_environment": {"ACCELERATE_USE_CPU": "1"},
                "rank_arguments": {"--machine_rank": "NODE_RANK"}, "free_port_argument": "--main_process_port"}}

    {"version": 2, "mode": "command", "command": ["python", "train.py"], "summary": {...}}

``summary`` (added by the backend) starts the log; ``gpus: null`` asks the driver. ``launch`` (optional) runs the
payload once per rank under a launcher: ``environment`` is added to the ranks' environment, ``cpu_environment``
too when the task has no GPU, ``rank_arguments`` take their values from the environment (a pod's node rank), and
``free_port_argument`` gets a free local port unless given. Each rank writes ``DIR/rank<RANK>.json``; the result is
rank 0's value, or the earliest error of any rank. A process that another launcher started as a rank other than 0
(``RANK``) reports nothing: rank 0 reports for the group.

The result envelope: ``{"ok": true, "return_value": ..., "cache": [...]}`` or
``{"ok": false, "error": {"type": ..., "message": ..., "traceback": ...}}``. Exit status 0 on success,
1 when the user code raised, 2 when the envelope itself is unusable.

The same file installs a task's requirements (:func:`install_requirements`: the local backend's venvs, the
Kubernetes init container), and its CUDA helpers (:func:`clear_cuda_cache`, :func:`list_gpus`,
:func:`cuda_memory_stats`) are what ``CudaHook`` and the worker's GPU inventory call: one implementation of each.
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
from collections.abc import Callable
from typing import Any

ENVELOPE_VERSION = 2
PREFIX = "[gpu]"
EXIT_USER_ERROR = 1
EXIT_BAD_ENVELOPE = 2
RESULT_TO_LOG = "-"
RESULT_MARKER = f"{PREFIX} result: "
RANK_RESULTS = "--rank-results"


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


# --------------------------------------------------------------------------------------------- the protocol
def load_envelope(source: str) -> dict[str, Any]:
    """Read an envelope from a file or from ``env:NAME``; raise for one this runtime cannot read."""
    if source.startswith("env:"):
        raw = base64.b64decode(os.environ[source[4:]]).decode()
    else:
        with open(source, encoding="utf-8") as handle:
            raw = handle.read()
    envelope = json.loads(raw)
    if envelope.get("version") != ENVELOPE_VERSION:
        raise ValueError(f"envelope version {envelope.get('version')!r}, this runtime reads {ENVELOPE_VERSION}")
    return envelope


def write_result(result_to: str, result: dict[str, Any]) -> None:
    """Report the result envelope: to a file (atomically), or as the last log line (``-``)."""
    if result_to == RESULT_TO_LOG:
        print(RESULT_MARKER + json.dumps(result), flush=True)
        return
    directory = os.path.dirname(os.path.abspath(result_to))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{result_to}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    os.replace(tmp, result_to)


def _rank_result_path(rank_results: str) -> str:
    return os.path.join(rank_results, f"rank{os.environ.get('RANK', '0')}.json")


def _error(exc: BaseException) -> dict[str, Any]:
    return {
        "time": time.time(),  # the earliest error of several ranks is the root cause
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


# --------------------------------------------------------------------------------------------- the payload
def _load_function(envelope: dict[str, Any]) -> Any:
    """Compile the shipped source so that tracebacks show the DAG file's own line numbers."""
    filename = envelope.get("filename") or "<gpu task>"
    padded = "\n" * (int(envelope.get("first_line", 1)) - 1) + envelope["source"]
    linecache.cache[filename] = (len(padded), None, padded.splitlines(True), filename)
    code = compile(padded, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace: dict[str, Any] = {"__name__": "__gpu_task__", "__file__": filename}
    exec(code, namespace)  # noqa: S102 - running the task's own function is the point
    return namespace[envelope["function"]]


def _exec_command(envelope: dict[str, Any]) -> dict[str, Any]:
    """Replace this process with the command (no shell); return the error result if it cannot start."""
    command = [str(part) for part in envelope["command"]]
    sys.stdout.flush()
    try:
        os.execvp(command[0], command)  # noqa: S606 - an argument list, no shell
    except OSError as exc:
        print(f"{PREFIX} cannot run {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        return {"ok": False, "error": _error(exc)}
    raise AssertionError("unreachable")  # pragma: no cover - execvp does not return


def _call_function(envelope: dict[str, Any]) -> dict[str, Any]:
    """Call the shipped function; return the result envelope (without the cache report). Never raises."""
    started = time.monotonic()
    try:
        function = _load_function(envelope)
        value = function(*envelope.get("args", []), **envelope.get("kwargs", {}))
        try:
            json.dumps(value, allow_nan=False)  # NaN and infinity are not JSON: XCom would refuse them later
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"the return value of {envelope['function']}() is a {type(value).__name__}, which cannot travel "
                f"back as JSON ({exc}); return None, bool, int, float (finite), str, or lists/dicts of those"
            ) from exc
    except SystemExit as exc:  # sys.exit() in user code: 0/None is success
        if exc.code not in (0, None):
            return _failed(exc)
        value = None
    except Exception as exc:  # noqa: BLE001 - everything the user code raises is reported
        return _failed(exc)
    return {"ok": True, "return_value": value, "duration_s": time.monotonic() - started}


def _failed(exc: BaseException) -> dict[str, Any]:
    traceback.print_exc()
    sys.stderr.flush()
    return {"ok": False, "error": _error(exc)}


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


def launch_command(envelope: dict[str, Any], source: str, rank_results: str, environ: dict[str, str]) -> list[str]:
    """The launcher's argv, e.g. ``python -m accelerate.commands.launch <args> bootstrap.py ENVELOPE ...``.

    :param source: the envelope's source (every rank reads it again)
    :param rank_results: the folder the ranks write their results to
    :param environ: the ranks' environment (``rank_arguments`` read it)
    """
    launch = envelope["launch"]
    argv = [sys.executable, "-m", launch["module"], *[str(a) for a in launch["args"]]]
    for flag, variable in (launch.get("rank_arguments") or {}).items():
        argv += [flag, environ[variable]]
    port_flag = launch.get("free_port_argument")
    if port_flag and port_flag not in argv:
        argv += [port_flag, str(_free_port())]
    if envelope["mode"] == "callable":
        return [*argv, os.path.abspath(__file__), source, RANK_RESULTS, rank_results]
    return [*argv, *[str(part) for part in envelope["command"]]]


def _has_gpus(envelope: dict[str, Any]) -> bool:
    gpus = (envelope.get("summary") or {}).get("gpus")
    return bool(gpus) if gpus is not None else bool(list_gpus())


def _run_launcher(envelope: dict[str, Any], source: str, result_to: str) -> int:
    """Run the payload under the envelope's launcher; rank 0's result, or the earliest error of any rank, wins."""
    import signal
    import subprocess
    import tempfile

    launch = envelope["launch"]
    environ = {**os.environ, **(launch.get("environment") or {})}
    no_gpu = launch.get("cpu_environment") or {}
    if no_gpu and not _has_gpus(envelope):
        environ.update(no_gpu)
    on_cpu = bool(no_gpu) and all(environ.get(name) == value for name, value in no_gpu.items())
    with tempfile.TemporaryDirectory(prefix="airflow-gpu-ranks-") as rank_results:
        argv = launch_command(envelope, source, rank_results, environ)
        cpu_note = f" (CPU: {' '.join(f'{k}={v}' for k, v in no_gpu.items())})" if on_cpu else ""
        print(f"{PREFIX} launching{cpu_note}: {' '.join(argv)}", flush=True)
        process = subprocess.Popen(argv, env=environ)
        previous = signal.signal(signal.SIGTERM, lambda *_: process.terminate())  # e.g. docker stop on PID 1
        try:
            status = process.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)
        if envelope["mode"] != "callable":
            return status
        results = {}
        for name in os.listdir(rank_results):
            if name.startswith("rank") and name.endswith(".json") and name[4:-5].isdigit():
                with open(os.path.join(rank_results, name), encoding="utf-8") as handle:
                    results[int(name[4:-5])] = json.load(handle)
    result, status = _merge_ranks(results, status, launch["module"])
    write_result(result_to, result)
    return status


def _merge_ranks(results: dict[int, dict[str, Any]], status: int, launcher: str) -> tuple[dict[str, Any], int]:
    """One result for the launch: the earliest error of any rank, else rank 0's value."""
    errors = sorted((r["error"].get("time", 0), rank) for rank, r in results.items() if not r.get("ok"))
    if errors:
        rank = errors[0][1]
        failed = results[rank]
        failed["error"]["message"] = f"rank {rank}: {failed['error']['message']}"
        return failed, EXIT_USER_ERROR
    if status == 0:  # rank 0's value; on the other machines of a multi-node run, rank 0 is elsewhere
        return {**results.get(0, {"ok": True, "return_value": None}), "ranks": len(results)}, 0
    message = (
        f"{launcher} exited with status {status} and no rank reported an exception "
        "(a rank was killed, or the launcher itself failed): see the log above"
    )
    return {"ok": False, "error": {"type": "LaunchError", "message": message, "traceback": ""}}, status or 1


# --------------------------------------------------------------------------------------------- requirements
class InstallError(RuntimeError):
    """An installer command failed; the message ends with its last lines of output."""


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced: ``https://***@host/...``."""
    import re

    return re.sub(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@", r"\g<scheme>***@", text)


def uv_ca_variable(uv_version: str) -> str:
    """The variable that makes this uv trust the system CA store, as pip does (renamed in uv 0.11)."""
    import re

    numbers = tuple(int(part) for part in re.findall(r"\d+", uv_version)[:2])
    return "UV_SYSTEM_CERTS" if numbers >= (0, 11) else "UV_NATIVE_TLS"


def _installer(argv: list[str], emit: Callable[[str], None], environ: dict[str, str] | None = None) -> str:
    """Run one installer command, each line of its output to ``emit``; raise with the tail on failure."""
    import subprocess

    emit(redact(f"$ {' '.join(argv)}"))
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ or dict(os.environ)
    )
    assert process.stdout is not None
    lines = []
    try:
        for line in process.stdout:
            lines.append(redact(line.rstrip()))
            emit(f"  {lines[-1]}")
    finally:
        if process.poll() is None:
            process.kill()
        status = process.wait()
    if status != 0:
        tail = "\n".join(lines[-20:])
        raise InstallError(f"{argv[0]} {' '.join(argv[1:3])} failed with exit status {status}:\n{tail}")
    return "\n".join(lines)


def _uv_from_pip(emit: Callable[[str], None]) -> str:
    """The uv binary for an image that has none: pip-installed into a temporary folder."""
    target = os.path.join(os.environ.get("TMPDIR", "/tmp"), "airflow-gpu-uv")
    _installer([sys.executable, "-m", "pip", "install", "--quiet", "--target", target, "uv"], emit)
    return os.path.join(target, "bin", "uv")


def split_credentials(index_args: list[str]) -> tuple[list[str], str]:
    """Index arguments with the credentials taken out of their URLs, and those credentials as netrc lines.

    Installers get the credentials from the netrc file (``NETRC``, read by uv and pip alike): never on a command
    line, which every user of the host can read in ``/proc``, nor in a log.
    """
    from urllib.parse import unquote, urlsplit, urlunsplit

    clean, lines = [], []
    for arg in index_args:
        parts = urlsplit(arg) if "://" in arg else None
        if parts is None or parts.username is None:
            clean.append(arg)
            continue
        host = parts.hostname or ""
        clean.append(urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else ""))))
        login, password = unquote(parts.username), unquote(parts.password or "")
        if any(c.isspace() for c in login + password):
            raise InstallError(f"credentials for {host} with white space cannot be passed in a netrc file")
        lines.append(f"machine {host} login {login} password {password or chr(34) * 2}")  # a token alone: ""
    return clean, "".join(f"{line}\n" for line in lines)


def install_requirements(
    requirements: list[str],
    index_args: list[str],
    *,
    installer: str,
    python: str,
    target: str | None = None,
    resolve_with: str | None = None,
    uv: str | None = None,
    emit: Callable[[str], None] = print,
    where: str = "the environment",
) -> None:
    """Install ``requirements`` for ``python`` (into ``target`` with ``--target``, else into its environment).

    uv installs only what is missing: ``uv pip install --dry-run`` against ``resolve_with`` (default ``python``)
    lists the missing packages as exact pins, and those alone are installed with ``--no-deps``, so a requirement
    like ``accelerate`` never brings a second torch next to the one already there. pip installs what ``python``
    does not see yet. Credentials in index URLs go to a private netrc file for the installers' time only.

    :param uv: the uv binary (default: ``uv`` on the PATH, else pip-installed first)
    :param emit: receives each line of the installers' output
    :param where: what ``resolve_with`` is, for the log ("the image", "the worker environment")
    :raises InstallError: when an installer fails
    """
    import shutil
    import tempfile

    index_args, netrc = split_credentials(index_args)
    environ = {**os.environ}
    secrets = tempfile.mkdtemp(prefix="airflow-gpu-netrc-") if netrc else None  # 0700
    try:
        if secrets is not None:
            environ["NETRC"] = os.path.join(secrets, "netrc")
            descriptor = os.open(environ["NETRC"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(netrc)
        into = ["--target", target] if target else []
        if installer == "pip":
            pip = [python, "-m", "pip", "install", "--disable-pip-version-check", *into, *index_args, *requirements]
            _installer(pip, emit, environ)
            return
        uv = uv or shutil.which("uv") or _uv_from_pip(emit)
        environ.setdefault(uv_ca_variable(_installer([uv, "--version"], lambda _: None)), "1")  # system CA store
        resolve = [uv, "pip", "install", "--dry-run", "--break-system-packages", "--python", resolve_with or python]
        plan = _installer([*resolve, *index_args, *requirements], emit, environ)
        pins = [line.strip()[2:].strip() for line in plan.splitlines() if line.strip().startswith("+ ")]
        if not pins:
            emit(f"{where} already satisfies every requirement")
            return
        _installer([uv, "pip", "install", "--no-deps", "--python", python, *into, *index_args, *pins], emit, environ)
    finally:
        if secrets is not None:
            shutil.rmtree(secrets, ignore_errors=True)


def install_main(argv: list[str]) -> int:
    """``TARGET INSTALLER [INDEX ARGS...] -- REQUIREMENTS...``: install into TARGET for this Python.

    What the Kubernetes init container runs.
    """
    target, installer, rest = argv[0], argv[1], argv[2:]
    index_args, requirements = rest[: rest.index("--")], rest[rest.index("--") + 1 :]
    try:
        install_requirements(
            requirements, index_args, installer=installer, python=sys.executable, target=target, where="the image",
            emit=lambda line: print(f"{PREFIX} {line}", flush=True),
        )  # fmt: skip
    except InstallError as exc:
        print(f"{PREFIX} {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


# --------------------------------------------------------------------------------------------- a task try
def run(envelope: dict[str, Any], source: str, result_to: str, *, rank: bool = False) -> int:
    """Run one envelope (read from ``source``) as the task process, or as one rank of a launch.

    :param result_to: where the result goes: a file, or ``-`` for the log
    :param rank: this process is one rank of a launch started by this runtime (no summary, no launcher)
    """
    if envelope.get("die_with_parent") and not rank:
        _die_with_parent()
    clear = envelope.get("clear_cache", True)
    before = clear_cuda_cache() if clear else {"status": "skipped", "reason": "disabled", "freed_bytes": 0}
    if not rank:
        print_summary(envelope.get("summary") or {}, before)
        if envelope.get("launch"):
            return _run_launcher(envelope, source, result_to)
    result = _exec_command(envelope) if envelope["mode"] == "command" else _call_function(envelope)
    after = clear_cuda_cache() if clear else before
    result["cache"] = [before, after]
    if result["ok"]:
        who = f"rank {os.environ.get('RANK', '0')}: " if rank else ""
        print(
            f"{PREFIX} {who}{envelope['function']}() finished in {result['duration_s']:.2f}s; CUDA cache after task: "
            f"{_describe_cache(after)}",
            flush=True,
        )
    if rank or os.environ.get("RANK", "0") == "0":  # under another launcher, rank 0 reports for the group
        write_result(result_to, result)
    if result["ok"]:
        return 0
    return 127 if envelope["mode"] == "command" else EXIT_USER_ERROR


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: ``bootstrap.py ENVELOPE RESULT`` or ``bootstrap.py ENVELOPE --rank-results DIR``."""
    argv = sys.argv[1:] if argv is None else argv
    rank = len(argv) == 3 and argv[1] == RANK_RESULTS
    if len(argv) != 2 and not rank:
        print(f"usage: bootstrap.py ENVELOPE RESULT  |  bootstrap.py ENVELOPE {RANK_RESULTS} DIR", file=sys.stderr)
        return EXIT_BAD_ENVELOPE
    result_to = _rank_result_path(argv[2]) if rank else argv[1]
    try:
        envelope = load_envelope(argv[0])
    except (OSError, KeyError, ValueError) as exc:
        print(f"{PREFIX} unusable task envelope {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        write_result(result_to, {"ok": False, "error": _error(exc)})
        return EXIT_BAD_ENVELOPE
    return run(envelope, argv[0], result_to, rank=rank)


if __name__ == "__main__":
    sys.exit(main())
