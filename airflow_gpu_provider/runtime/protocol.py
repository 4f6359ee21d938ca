"""The contract between the worker and the runtime (envelope version 2): what both sides read and write.

The runtime is shipped as one zip archive (``runtime.pyz``, built by ``task/runtime_zip.py``) holding this package
as ``airflow_gpu_runtime``; any image with ``python3`` runs it::

    python3 runtime.pyz ENVELOPE RESULT                the task process
    python3 runtime.pyz ENVELOPE --rank-results DIR     one rank of a launch (started by the runtime itself)
    python3 runtime.pyz install [OPTIONS] TARGET INSTALLER [INDEX ARGS...] -- REQUIREMENTS...
                                                        a task's requirements (``install.py``)
    python3 runtime.pyz launcher FAILURES MODULE ARGS...
                                                        a launch's launcher (started by the runtime itself), which
                                                        names its failed ranks in FAILURES (``launcher.py``)
    python3 runtime.pyz reap ENVELOPE RESULT            the task process beneath the pinned subreaper, which
                                                        stops what it leaves running (a job's entrypoint:
                                                        ``reaper.py``)

``python3 -m airflow_gpu_runtime`` (the archive on ``PYTHONPATH``) runs the same. ``ENVELOPE`` is a JSON file
path, or ``env:NAME`` for base64 JSON in an environment variable. ``RESULT`` is where the result envelope goes: a
file path, or ``-`` to print it as the last log line (``[gpu] result: {...}``, after a line end of its own) where
it travels back on the output stream (Docker, a multi-node Kubernetes run, Ray). It is a command-line argument,
not part of the envelope, so that a runtime that cannot read its envelope still reports why. The envelope::

    {"version": 2, "mode": "callable", "function": "train", "source": "def train(...): ...",
     "filename": "/dags/demo.py", "first_line": 12, "annotations_future": true, "args": [...], "kwargs": {...},
     "clear_cache": true,
     "summary": {"backend": "local", "image": "...", "requirements_hash": "...", "resources": "...",
                 "gpus": [{"index": "0", "name": "...", "memory_total": 85899345920}] | null},
     "die_with_parent": false, "profile": {"interval_s": 1.0, "host": "worker-1"} | null, "resume": true,
     "launch": {"module": "accelerate.commands.launch", "args": ["--num_processes", "2", ...], "processes": 2,
                "environment": {...}, "cpu_environment": {"ACCELERATE_USE_CPU": "1"},
                "rank_arguments": {"--machine_rank": "NODE_RANK"}, "free_port_argument": "--main_process_port"}}

    {"version": 2, "mode": "command", "command": ["python", "train.py"], "summary": {...}}

The function is defined in a module of its own (``__gpu_task__``, in ``sys.modules``), compiled with the DAG file's
own ``from __future__ import annotations`` when ``annotations_future`` (:func:`function_tree`).
``summary`` (added by the backend) starts the log; ``gpus: null`` asks the driver; its ``effective`` resources
are exported to the task as ``AIRFLOW_GPU_RESOURCES`` (JSON; ``cpu_fallback`` is true there after a CPU fallback,
whose reason is the summary's ``cpu_fallback_reason``). ``launch`` (optional) runs the
payload once per rank under a launcher: ``environment`` is added to the ranks' environment, ``cpu_environment``
too when the task has no GPU, ``rank_arguments`` take their values from the environment (a pod's node rank), and
``free_port_argument`` gets a free local port unless given, ``log_dir_argument`` a folder for the ranks' output
(removed with the launch); ``processes`` (the ranks on each machine) is for the
backend, which gives each rank its share of the CPUs' threads. Each rank writes ``DIR/rank<RANK>.json``; the result is
rank 0's value, or the earliest error of any rank. A process that another launcher started as a rank other than 0
(``RANK``) reports nothing: rank 0 reports for the group. A copy of the task process that the task's own code
starts as a rank above 0 (PyTorch Lightning's ``ddp`` runs ``sys.argv`` again with ``LOCAL_RANK``; it inherits
``AIRFLOW_GPU_TASK_PID``) is a secondary rank: no summary, no sampler, no result; rank 0 ends those still running
when its function has returned, naming each (``ranks.py``).

``modules`` (optional): project modules shipped with the task, ``{"names": [...], "sha256": ..., "zip": BASE64}``
(or ``"zip": "env:AIRFLOW_GPU_MODULES"`` in a pod): a zip archive the runtime unpacks into a private folder and puts
first on ``sys.path`` and ``PYTHONPATH`` (``modules.py``).

The task's checkpoint folder comes in the environment (``AIRFLOW_GPU_CHECKPOINT_DIR``, set by the backend: a path
here, or a URI), not in the envelope; it is made when missing and named in the log. ``resume`` (optional) looks
for the newest checkpoint there (an ``accelerator.save_state`` folder, a Trainer's ``checkpoint-N``, a Lightning
``*.ckpt`` or ``torch.save`` file, ``checkpoint.py``), exports it as ``AIRFLOW_GPU_RESUME_FROM`` /
``AIRFLOW_GPU_RESUME_STEP``, and has each process that runs the function call ``resume(accelerator)`` right after
its first ``Accelerator.prepare`` (``resuming.py``).
A command or launcher the runtime starts finds the archive first on its ``PYTHONPATH`` (``from airflow_gpu_runtime
import resume`` in a script).

``profile`` (optional) starts the sampler for the try (one per node under a launcher, ``telemetry/``): NVML
through ``ctypes``, else a CPU profile from ``/proc``; a command then runs as the runtime's child instead of
replacing it. Its ``host`` is the worker's host name as Airflow knows it; the profile (version
:data:`PROFILE_VERSION`, read by ``telemetry/profile.py``) records it, the summary's CPU fallback and its reason.

The result envelope: ``{"ok": true, "return_value": ..., "cache": [...]}`` or
``{"ok": false, "error": {"type": ..., "kind": "gpu_oom"|"host_oom"|"infrastructure"|"error", "message": ...,
"traceback": ...}}``
(a command's failure: ``{"ok": false, "exit_status": N}``), with ``"profile": {...}`` when the try was sampled and
``"gpus": [...]`` when it failed. A failed result carries its class, ``"failure": {"class":
"application"|"resources"|"infrastructure", "reason": ..., "evidence": [...], "host": ..., "node": ...,
"gpus": [{"index", "uuid"}]}``: ``infrastructure`` for an NCCL timeout or abort in any rank (``error.kind``), or
an Xid error whose GPU needs a reset or more (its recovery action, else NVIDIA's Xid catalogue: ``failures.py``)
or an uncorrectable ECC error that the sampler saw (the profile's ``gpu_faults``). Exit status 0 on success, 1
when the user code raised, 2 when the envelope itself is unusable (a command: its own status, 127 when it cannot
start).

Installer credentials never travel on a command line nor in a log: :func:`split_credentials` takes them out of
the index URLs into netrc lines, which reach the installers as the file named by ``NETRC``; :func:`redact` hides
any that are left in a line of output.

This module is what the worker imports of the runtime (with ``cuda.py``); it stays cheap to import.
"""

from __future__ import annotations

import os
from typing import Any

ENVELOPE_VERSION = 2
PROFILE_VERSION = 2  # the profile the sampler returns; telemetry/profile.py reads it (and version 1)
PREFIX = "[gpu]"
EXIT_USER_ERROR = 1
EXIT_BAD_ENVELOPE = 2
EXIT_CANNOT_START = 127  # a command that cannot be started, as a shell reports it
RESULT_TO_LOG = "-"
RESULT_MARKER = f"{PREFIX} result: "
RANK_RESULTS = "--rank-results"
INSTALL = "install"  # the first argument of ``runtime.pyz install ...``
LAUNCHER = "launcher"  # the first argument of ``runtime.pyz launcher FAILURES MODULE ARGS...``
REAP = "reap"  # ``runtime.pyz reap ENVELOPE RESULT``: the task process beneath the pinned subreaper (reaper.py)
RESOURCES_ENV = "AIRFLOW_GPU_RESOURCES"  # the resources the task runs with, as JSON (the summary's "effective")
CHECKPOINT_ENV = "AIRFLOW_GPU_CHECKPOINT_DIR"  # the task's checkpoint folder (set by the backend): a path or a URI
RESUME_FROM_ENV = "AIRFLOW_GPU_RESUME_FROM"  # with "resume": the newest checkpoint found there, loaded after prepare()
RESUME_STEP_ENV = "AIRFLOW_GPU_RESUME_STEP"  # and the number in its folder's name (checkpoint_2 -> 2)
CHECKPOINT_URI_ENV = "AIRFLOW_GPU_CHECKPOINT_URI"  # with "resume" and a URI folder: the URI, staged locally
MODULES_DIR_ENV = "AIRFLOW_GPU_MODULES_DIR"  # the folder the task process unpacked its project modules into
MODULES_ENV = "AIRFLOW_GPU_MODULES"  # a pod's project modules archive (base64), named by the envelope's modules.zip
RANK_PREFIX = "[rank {rank}] "  # before each line of a rank's output where several ranks share the log (output.py)
TASK_PID_ENV = "AIRFLOW_GPU_TASK_PID"  # set by the task process for what it starts: a copy of it knows it is one

# The error kinds of a failed result (``error.kind``); a container or pod OOM-killed is HOST_OOM too, told by its
# backend.
GPU_OOM = "gpu_oom"
HOST_OOM = "host_oom"
ERROR = "error"
INFRASTRUCTURE = "infrastructure"  # an NCCL timeout or abort (the runtime's ``failures.py`` decides)

# The class of a failed try (the result's ``failure``, decided by the runtime's ``failures.py``; a pod's end by the
# Kubernetes backend's ``failures.py``): the user's code, its resources (the OOM ladder), or the infrastructure.
APPLICATION, RESOURCES = "application", "resources"
FAILURE_CLASSES = (APPLICATION, RESOURCES, INFRASTRUCTURE)


def failure_class(kind: str | None) -> str:
    """The class of an error of this ``kind``: an OOM is the resources', an NCCL failure the infrastructure's."""
    if kind in (GPU_OOM, HOST_OOM):
        return RESOURCES
    return INFRASTRUCTURE if kind == INFRASTRUCTURE else APPLICATION


def function_tree(source: str, function: str, *, annotations_future: bool, filename: str = "<gpu task>") -> Any:
    """The shipped source's syntax tree, compiled as if it were in its DAG file (``ast.Module``).

    As in a module, the source is compiled with the DAG file's own ``from __future__ import annotations``
    (``annotations_future``) or without it, so a dataclass, an enum or a typed helper defined in the function
    behaves as it would there. Only the annotations of the shipped function's own signature are never evaluated
    (strings, as the future makes them): they name what the DAG file imports at module level, which does not
    travel. The worker checks the names the source reads in this same tree (``task/callable.py``).
    """
    import ast

    tree = ast.parse(source, filename)
    if annotations_future:
        return tree

    def text(node: ast.expr) -> ast.expr:
        return ast.copy_location(ast.Constant(ast.unparse(node)), node)

    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            a = node.args
            for argument in filter(None, [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]):
                argument.annotation = argument.annotation and text(argument.annotation)
            node.returns = node.returns and text(node.returns)
    return tree


JSON_VALUES = "None, bool, int, float (finite), str, or lists/dicts of those"


def json_problem(value: Any, where: str = "") -> str | None:
    """Where ``value`` holds what cannot travel as JSON, in words (``['metrics']['loss'] is a set``); ``None``: none.

    The one test of a task's arguments and return value: what ``json.dumps(value, allow_nan=False)`` takes.
    """
    import math

    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where or 'it'} is {value!r} (not finite)"
    if isinstance(value, (list, tuple)):
        return next((p for i, item in enumerate(value) if (p := json_problem(item, f"{where}[{i}]"))), None)
    if isinstance(value, dict):
        for key, item in value.items():
            if not (key is None or isinstance(key, (bool, int, float, str))):
                return f"{where or 'it'} has a key of type {type(key).__name__} ({key!r})"
            if (found := json_problem(item, f"{where}[{key!r}]")) is not None:
                return found
        return None
    package = type(value).__module__.partition(".")[0]
    name = ("" if package == "builtins" else f"{package}.") + type(value).__qualname__
    return f"{where or 'it'} is {'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"


def load_envelope(source: str) -> dict[str, Any]:
    """Read an envelope from a file or from ``env:NAME``; raise for one this runtime cannot read."""
    import json

    if source.startswith("env:"):
        import base64

        raw = base64.b64decode(os.environ[source[4:]]).decode()
    else:
        with open(source, encoding="utf-8") as handle:
            raw = handle.read()
    envelope: dict[str, Any] = json.loads(raw)
    if envelope.get("version") != ENVELOPE_VERSION:
        raise ValueError(f"envelope version {envelope.get('version')!r}, this runtime reads {ENVELOPE_VERSION}")
    return envelope


def write_result(result_to: str, result: dict[str, Any]) -> None:
    """Report the result envelope: to a file (atomically), or as the last log line (``-``)."""
    import json
    import sys

    if result_to == RESULT_TO_LOG:
        # one call: the line whole (output.py); after a line end, so that output left without one never hides it
        sys.stdout.write(f"\n{RESULT_MARKER}{json.dumps(result)}\n")
        sys.stdout.flush()
        return
    directory = os.path.dirname(os.path.abspath(result_to))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{result_to}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    os.replace(tmp, result_to)


def rank_result_path(rank_results: str) -> str:
    """Where this rank (``RANK``, 0 when unset) writes its result in a launch's rank folder."""
    return os.path.join(rank_results, f"rank{os.environ.get('RANK', '0')}.json")


def format_bytes(amount: float | None) -> str:
    """Bytes for logs: ``17179869184`` -> ``16.0 GiB``, ``512`` -> ``512 B``, ``None`` -> ``?``."""
    if amount is None:
        return "?"
    value = float(amount)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


class InstallError(RuntimeError):
    """An installer command failed, or its index credentials cannot be passed; the message says why."""


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced: ``https://***@host/...``.

    What goes: from ``://`` to the last ``@`` of the same word (a secret with a ``/``, as cloud keys have), and to
    the last ``@`` before the next ``/`` (a mistyped URL with a space, ``https://user:to ken@host``): nothing of
    the credentials is left, at the cost of hiding a little more than them now and then.
    """
    if "://" not in text:
        return text
    import re

    # linear in the text's length: a scheme starts only where a run of scheme characters starts, and the run is
    # taken whole (an atomic group, spelled for every Python 3): a long run is never scanned once per position
    scheme = r"(?<![A-Za-z0-9+.-])(?=(?P<scheme>[A-Za-z0-9+.-]*))(?P=scheme)://"
    text = re.sub(scheme + r"\S*@", r"\g<scheme>://***@", text)
    return re.sub(scheme + r"[^/\n]*@", r"\g<scheme>://***@", text)


def uv_ca_variable(uv_version: str) -> str:
    """The variable that makes this uv trust the system CA store, as pip does (renamed in uv 0.11)."""
    import re

    numbers = tuple(int(part) for part in re.findall(r"\d+", uv_version)[:2])
    return "UV_SYSTEM_CERTS" if numbers >= (0, 11) else "UV_NATIVE_TLS"


def split_credentials(index_args: list[str]) -> tuple[list[str], str]:
    """Index arguments with the credentials taken out of their URLs, and those credentials as netrc lines.

    Installers get the credentials from the netrc file (``NETRC``, read by uv and pip alike): never on a command
    line, which every user of the host can read in ``/proc``, nor in a log.

    :raises InstallError: for credentials with white space, which a netrc file cannot hold
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
