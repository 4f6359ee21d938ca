"""A launcher's ranks (``launch`` in the envelope): each runs this runtime again; their results become one."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

from .command import command_result, importable_runtime, runtime_archive
from .cuda import list_gpus
from .failures import settle
from .launcher import describe, ranks_failed, read_failures
from .output import say
from .protocol import EXIT_USER_ERROR, GPU_OOM, HOST_OOM, LAUNCHER, PREFIX, RANK_RESULTS, write_result
from .signals import run_child

if TYPE_CHECKING:
    from .telemetry.sampler import Profiler


def runtime_script() -> str:
    """What runs this runtime again as ``python SCRIPT ...``: the archive it was loaded from, else ``__main__.py``.

    An unpacked runtime (``python -m airflow_gpu_provider.runtime``) has no archive: its ``__main__.py``, run as a
    file, finds its package.
    """
    archive = runtime_archive()
    if archive:
        return archive
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def launch_command(envelope: dict[str, Any], source: str, rank_results: str, environ: dict[str, str]) -> list[str]:
    """The launcher's argv: ``python runtime.pyz launcher FAILURES accelerate.commands.launch <args> runtime.pyz ...``.

    The launcher module runs in a runtime process (``launcher.py``), which names the ranks that failed.

    :param source: the envelope's source (every rank reads it again)
    :param rank_results: the folder the ranks write their results to (and the launcher, its failed ranks)
    :param environ: the ranks' environment (``rank_arguments`` read it)
    """
    launch = envelope["launch"]
    failures = os.path.join(rank_results, FAILURES)
    argv = [sys.executable, runtime_script(), LAUNCHER, failures, launch["module"], *[str(a) for a in launch["args"]]]
    for flag, variable in (launch.get("rank_arguments") or {}).items():
        argv += [flag, environ[variable]]
    port_flag = launch.get("free_port_argument")
    if port_flag and port_flag not in argv:
        argv += [port_flag, str(_free_port())]
    if launch.get("log_dir_argument"):  # where the ranks' output is written before the launcher reads it
        argv += [launch["log_dir_argument"], os.path.join(rank_results, "output")]
    if envelope["mode"] == "callable":
        return [*argv, runtime_script(), source, RANK_RESULTS, rank_results]
    return [*argv, *[str(part) for part in envelope["command"]]]


def _has_gpus(envelope: dict[str, Any]) -> bool:
    gpus = (envelope.get("summary") or {}).get("gpus")
    return bool(gpus) if gpus is not None else bool(list_gpus())


def run_launcher(
    envelope: dict[str, Any], source: str, result_to: str, profiler: Profiler | None, gpus: list[dict[str, Any]]
) -> int:
    """Run the payload under the envelope's launcher; rank 0's result, or the earliest error of any rank, wins."""
    import tempfile

    launch = envelope["launch"]
    environ = importable_runtime({**os.environ, **(launch.get("environment") or {})})
    no_gpu = launch.get("cpu_environment") or {}
    if no_gpu and not _has_gpus(envelope):
        environ.update(no_gpu)
    on_cpu = bool(no_gpu) and all(environ.get(name) == value for name, value in no_gpu.items())
    with tempfile.TemporaryDirectory(prefix="airflow-gpu-ranks-") as rank_results:
        argv = launch_command(envelope, source, rank_results, environ)
        cpu_note = f" (CPU: {' '.join(f'{k}={v}' for k, v in no_gpu.items())})" if on_cpu else ""
        say(f"{PREFIX} launching{cpu_note}: {' '.join(argv)}")
        status = run_child(argv, environ)
        profile = None if profiler is None else profiler.stop()
        failures = read_failures(os.path.join(rank_results, FAILURES))
        if envelope["mode"] != "callable":
            result = ranks_failed(failures) if failures and status != 0 else command_result(status)
            if profile is not None or "error" in result:
                result = {**result, **({"profile": profile} if profile is not None else {})}
                write_result(result_to, settle(result, profile))
            return status
        results = {}
        for name in os.listdir(rank_results):
            if name.startswith("rank") and name.endswith(".json") and name[4:-5].isdigit():
                with open(os.path.join(rank_results, name), encoding="utf-8") as handle:
                    results[int(name[4:-5])] = json.load(handle)
    result, status = merge_ranks(results, status, launch["module"], failures)
    if profile is not None:
        result["profile"] = profile
    if not result.get("ok"):
        result["gpus"] = gpus  # what an OOM escalation compares the next try's GPU with
        settle(result, profile)  # its class (failures.py): an NCCL failure in any rank, a GPU fault seen here
    write_result(result_to, result)
    return status


def merge_ranks(
    results: dict[int, dict[str, Any]], status: int, launcher: str, failures: list[dict[str, Any]] | None = None
) -> tuple[dict[str, Any], int]:
    """One result for the launch: the earliest error of any rank, else rank 0's value.

    :param failures: how the ranks that failed ended, as the launcher saw them (``launcher.py``)
    """
    # an out-of-memory error of any rank is the cause; the other ranks' errors (a broken collective) follow it
    errors = sorted(
        (r["error"].get("kind") not in (GPU_OOM, HOST_OOM), r["error"].get("time", 0), rank)
        for rank, r in results.items()
        if not r.get("ok")
    )
    if errors:
        rank = errors[0][2]
        failed = results[rank]
        causes = [f"rank {rank}: {failed['error']['message']}"]
        # a rank killed without a word (SIGKILL) is the likelier cause of the others' broken collectives
        killed = [describe(f) for f in failures or [] if f["rank"] not in results and f.get("signal") != "SIGTERM"]
        first = failed["error"].get("kind") in (GPU_OOM, HOST_OOM)
        failed["error"]["message"] = "; ".join([*causes, *killed] if first else [*killed, *causes])
        return failed, EXIT_USER_ERROR
    if status == 0:  # rank 0's value; on the other machines of a multi-node run, rank 0 is elsewhere
        return {**results.get(0, {"ok": True, "return_value": None}), "ranks": len(results)}, 0
    if failures:
        return ranks_failed(failures), status
    message = (
        f"{launcher} exited with status {status} and no rank reported an exception "
        "(a rank was killed, or the launcher itself failed): see the log above"
    )
    return {"ok": False, "error": {"type": "LaunchError", "message": message, "traceback": ""}}, status or 1


FAILURES = "failures.json"  # in the rank results folder: the failed ranks, as the launcher saw them
