"""The subreaper of a Ray task's processes on its node: what the job's entrypoint (and each rank) runs first.

Shipped in the job's ``working_dir`` and run there with the node's Python (standard library only):
``python airflow_gpu_ray_reaper.py runtime.pyz ENVELOPE RESULT``. In order:

- It names the interpreter that runs the task (path, version, host): a job runs the ``python`` first on the PATH of
  the shell that ran ``ray start`` on its node, which may not be the one with the task's packages.
- It checks that the node reaches the task's checkpoint folder where the worker made it
  (``AIRFLOW_GPU_CHECKPOINT_ON_WORKER``, set by ``job.submit``): a node that lacks it does not share the worker's
  file system at that path, and the job fails at once, saying so, rather than checkpoint to a disk of its own that
  the next try, on another node, would never see.
- It takes the envelope (the function's source and arguments) and the task's own variables (``environment.json``
  beside it, ``ImageSettings.environment``) out of the ``working_dir`` into a private folder of its own: Ray keeps
  an unpacked ``working_dir`` on the node after the job, and they are never in the job's ``runtime_env``.
- It checks that the modules the task's function imports (its unconditional ``import`` statements) and its
  launcher resolve on this interpreter, and fails at once naming the interpreter and the fix when one does not.

Then it runs the runtime beneath the pinned subreaper (``runtime/reaper.py``'s ``reap_main``, loaded from the job's
runtime archive: the one a Slurm job's ``runtime.pyz reap`` runs) with the task's variables: whatever the task
leaves behind (a background child, a ``setsid`` grandchild, a process that ignores SIGTERM) is re-parented to it,
pinned by a pidfd and stopped when the runtime ends or Ray stops the job (SIGTERM to the entrypoint's process group):
SIGTERM, then SIGKILL after the grace (``AIRFLOW_GPU_KILL_GRACE``, 2 s). A job leaves no process on its node, as a
container leaves none on its host. Its exit status is the runtime's; a refusal's is 2, with a result that says why.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import json
import os
import platform
import shutil
import signal
import socket
import sys
import tempfile
from typing import Any

ON_WORKER = "AIRFLOW_GPU_CHECKPOINT_ON_WORKER"  # the checkpoint folder the worker made: every node must see it
ENVIRONMENT = "environment.json"  # the task's own variables, beside the envelope
MARKER = "[gpu] result: "  # runtime/protocol.py RESULT_MARKER


def interpreter() -> str:
    """The interpreter that runs the task here: its path, its version and the host."""
    return f"{sys.executable} (Python {platform.python_version()}) on {socket.gethostname()}"


def unreached_checkpoint() -> str | None:
    """Why this node cannot run the task: the checkpoint folder the worker made is not here; else ``None``."""
    folder = os.environ.get(ON_WORKER, "")
    if not folder or os.path.isdir(folder):
        return None
    return (
        f"[gpu] error: the task's checkpoint folder {folder}, made by the Airflow worker, is not on this Ray node: "
        "the checkpoint root is not a file system that every node mounts at the same path. Mount it on every node "
        "at that path, or make checkpoint= (or [gpu] checkpoint_root) an object-storage URI (docs/ray.md)."
    )


def task_imports(envelope: dict[str, Any]) -> list[str]:
    """The top-level modules the task needs; not the project modules it ships.

    The function's unconditional imports (in its body and its source's top level, not those under ``if``/``try``),
    and its launcher's module.
    """
    names: list[str] = []
    source, function = envelope.get("source"), envelope.get("function")
    if envelope.get("mode") == "callable" and isinstance(source, str):
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a syntax this Python does not know: the runtime says so itself
            tree = ast.Module(body=[], type_ignores=[])
        bodies = [tree.body]
        bodies += [
            n.body for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function
        ]
        for body in bodies:
            for statement in body:
                if isinstance(statement, ast.Import):
                    names += [alias.name.split(".")[0] for alias in statement.names]
                elif isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
                    names.append(statement.module.split(".")[0])
    module = (envelope.get("launch") or {}).get("module")
    if isinstance(module, str):
        names.append(module.split(".")[0])
    shipped = set((envelope.get("modules") or {}).get("names") or ())
    return [name for name in dict.fromkeys(names) if name not in shipped and name != "__future__"]


def missing_imports(envelope: dict[str, Any]) -> str | None:
    """Why this interpreter cannot run the task: modules it needs that do not resolve here; else ``None``."""
    missing = []
    for name in task_imports(envelope):
        with contextlib.suppress(ImportError, ValueError):
            if importlib.util.find_spec(name) is None:
                missing.append(name)
    if not missing:
        return None
    return (
        f"[gpu] error: the task imports {', '.join(missing)}, which this Ray node's Python cannot: "
        f"{interpreter()}. A Ray job runs the `python` first on the PATH of the shell that ran `ray start` on its "
        "node. Start Ray from the environment that has the task's packages (that environment's `bin/ray start`, "
        "or its bin first on PATH), or list them in requirements= (docs/ray.md)."
    )


def refuse(message: str, result: str) -> int:
    """Fail the job before the task runs: the message in the log, and a result that carries it (exit status 2)."""
    print(message, file=sys.stderr, flush=True)
    envelope = {
        "ok": False,
        "error": {"type": "RuntimeError", "kind": "error", "message": message.removeprefix("[gpu] error: ")},
    }
    if result == "-":
        print(MARKER + json.dumps(envelope), flush=True)
    else:
        with open(result, "w", encoding="utf-8") as handle:
            json.dump(envelope, handle)
    return 2


def take(path: str, folder: str) -> str:
    """Move a file of the ``working_dir`` into ``folder`` (private): the ``working_dir`` keeps no copy."""
    target = os.path.join(folder, os.path.basename(path))
    with contextlib.suppress(FileNotFoundError):
        shutil.copyfile(path, target)
        os.unlink(path)
    return target


def main(argv: list[str]) -> int:
    """Run the runtime beneath this subreaper; stop what it left; exit with its status."""
    runtime, envelope_file, result = argv[:3]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped before the runtime starts: clean up still
    print(f"[gpu] Ray runs the task with {interpreter()}", flush=True)
    refused = unreached_checkpoint()
    if refused is not None:
        return refuse(refused, result)
    folder = tempfile.mkdtemp(prefix="airflow-gpu-job-")
    try:
        environment = take(os.path.join(os.path.dirname(envelope_file), ENVIRONMENT), folder)
        envelope_file = take(envelope_file, folder)
        if os.path.isfile(envelope_file):  # else the runtime says the envelope is missing
            with open(envelope_file, encoding="utf-8") as handle:
                refused = missing_imports(json.load(handle))
            if refused is not None:
                return refuse(refused, result)
        variables = _variables(environment)
        variables.pop("AIRFLOW_GPU_KILL_GRACE", None)  # the subreaper's grace is the provider's, not the task's
        os.environ.update(variables)  # the runtime's, beneath the subreaper
        return int(_pinned(runtime).reap_main(runtime, [envelope_file, result, *argv[3:]]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _variables(path: str) -> dict[str, str]:
    """The task's own variables (none without the file)."""
    with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8") as handle:
        return {str(k): str(v) for k, v in json.load(handle).items()}
    return {}


def _pinned(runtime: str) -> Any:
    """The pinned subreaper (``runtime/reaper.py``), from the job's own runtime archive (standard library only)."""
    sys.path.insert(0, os.path.abspath(runtime))
    return importlib.import_module("airflow_gpu_runtime.reaper")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
