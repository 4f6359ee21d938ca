"""The runtime's entry point: one task try, one rank of a launch, or an install (the forms: ``protocol.py``)."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:  # pragma: no cover - run in subprocesses by the tests
    # Run as a file, not as a module: a rank of a launch when the runtime is an unpacked folder (``python -m
    # airflow_gpu_provider.runtime``; launch.runtime_script). Import this package by its name, from the folder above.
    import importlib

    folder, parts = os.path.dirname(os.path.abspath(__file__)), list[str]()
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        folder, name = os.path.split(folder)
        parts.insert(0, name)
    sys.path[0] = folder  # not this folder, whose module names are not top-level ones
    sys.exit(importlib.import_module(".".join(parts) + ".__main__").main())

import json
import signal
from typing import TYPE_CHECKING, Any

from .checkpoint import drop_stages, prepare_checkpoint
from .command import command_result, run_command
from .cuda import clear_cuda_cache
from .escalation import error_record
from .failures import settle
from .function import call_function
from .modules import describe_modules, remove_modules, unpack_modules
from .output import say, split_output, whole_lines
from .protocol import (
    EXIT_BAD_ENVELOPE,
    EXIT_USER_ERROR,
    INSTALL,
    LAUNCHER,
    PREFIX,
    RANK_RESULTS,
    REAP,
    RESOURCES_ENV,
    load_envelope,
    rank_result_path,
    write_result,
)
from .ranks import CopyWatch, announce_secondary, end_leftover_ranks, framework_rank, is_secondary, mark_task_process
from .resuming import resume_after_prepare
from .share import enforce_share, refuse_copy
from .signals import Terminated, die_with_parent, end_by_sigterm, exit_on_sigterm
from .summary import describe_cache, print_summary

if TYPE_CHECKING:
    from .telemetry.sampler import Profiler

USAGE = (
    f"usage: runtime.pyz ENVELOPE RESULT  |  runtime.pyz ENVELOPE {RANK_RESULTS} DIR  |  "
    f"runtime.pyz {INSTALL} [OPTIONS] TARGET INSTALLER [INDEX ARGS...] -- REQUIREMENTS...  |  "
    f"runtime.pyz {LAUNCHER} FAILURES MODULE ARGS...  |  runtime.pyz {REAP} ENVELOPE RESULT"
)


def _start_profiler(envelope: dict[str, Any]) -> Profiler | None:
    if not envelope.get("profile"):
        return None
    from .telemetry.sampler import start_profiler  # only where the task is sampled

    return start_profiler(envelope)


def _clean_up() -> None:
    """What a task process stopped by SIGTERM removes: staged checkpoint folders, unpacked modules."""
    drop_stages()
    remove_modules()


def _watch_copies(result_to: str | None, gpus: list[dict[str, Any]]) -> CopyWatch:
    """Name the first copy of the task process to fail, in the result too: the framework may then kill this one."""
    from .launcher import ranks_failed

    def report(failure: dict[str, Any]) -> None:
        if result_to is not None:
            write_result(result_to, settle({**ranks_failed([failure]), "gpus": gpus}, None))

    watch = CopyWatch(report)
    watch.start()
    return watch


def run(envelope: dict[str, Any], source: str, result_to: str | None, *, rank: bool = False) -> int:
    """Run one envelope (read from ``source``) as the task process, or as one rank of a launch.

    :param result_to: where the result goes: a file, or ``-`` for the log; ``None`` for none (a secondary rank,
        ``ranks.py``, whose failure is in the log)
    :param rank: this process is one rank of a launch, or a copy of the task process (no summary, no launcher, no
        sampler)
    """
    if envelope.get("die_with_parent") and not rank:
        die_with_parent()
    clear = envelope.get("clear_cache", True)
    before = clear_cuda_cache() if clear else {"status": "skipped", "reason": "disabled", "freed_bytes": 0}
    profiler, gpus = None, []
    if not rank:
        summary = envelope.get("summary") or {}
        if "effective" in summary:  # for the user's code, its commands and a launcher's ranks
            os.environ[RESOURCES_ENV] = json.dumps(summary["effective"])
        gpus = print_summary(summary, before)
        unenforced = enforce_share(summary.get("share"))
        if unenforced is not None:
            if result_to is not None:
                write_result(result_to, {"ok": False, "error": error_record(unenforced), "gpus": gpus})
            return EXIT_USER_ERROR
        describe_modules(envelope)
        prepare_checkpoint(envelope)
        profiler = _start_profiler(envelope)
        mark_task_process()  # what the task's code starts again knows it is a copy (ranks.py)
        if envelope.get("launch"):
            from .launch import run_launcher  # only where the envelope has a launcher

            assert result_to is not None  # the task process always reports
            return run_launcher(envelope, source, result_to, profiler, gpus)
    reports = result_to is not None and (rank or os.environ.get("RANK", "0") == "0")  # else rank 0 reports
    if envelope["mode"] == "command":
        if reports and profiler is None:  # this process becomes the command: its exit status alone decides
            write_result(str(result_to), command_result(0))
        result, status = run_command(envelope, sampled=profiler is not None)
    else:
        if not rank:
            exit_on_sigterm()
        watch = None if rank else _watch_copies(result_to if reports else None, gpus)
        if envelope.get("resume"):
            resume_after_prepare()
        try:
            result = call_function(envelope)
        except Terminated:
            return end_by_sigterm(_clean_up)
        failure = watch.stop(wait_s=0 if result["ok"] else 1.0) if watch is not None else None
        if failure is not None and not result["ok"]:  # the copy that failed first is the likelier cause
            from .launch import merge_ranks

            result = merge_ranks({0: result}, EXIT_USER_ERROR, "", [failure])[0]
        status = 0 if result["ok"] else EXIT_USER_ERROR
    after = clear_cuda_cache() if clear else before
    result["cache"] = [before, after]
    if profiler is not None:
        result["profile"] = profiler.stop()
    if not result["ok"] and not rank:
        result["gpus"] = gpus  # what an OOM escalation compares the next try's GPU with
        settle(result, result.get("profile"))  # its class: the user's code, its resources, the infrastructure
    if result["ok"] and envelope["mode"] == "callable":
        who = f"rank {framework_rank() or 0}: " if rank else ""
        say(
            f"{PREFIX} {who}{envelope['function']}() finished in {result['duration_s']:.2f}s; CUDA cache after task: "
            f"{describe_cache(after)}"
        )
    if reports:  # every run reports: a missing result is never a success (task/result.py)
        write_result(str(result_to), result)
    if not rank and envelope["mode"] == "callable":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the result is written: what remains is to end the ranks
        end_leftover_ranks()
    return status


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: ``ENVELOPE RESULT``, ``ENVELOPE --rank-results DIR`` or ``install ...``."""
    argv = sys.argv[1:] if argv is None else argv
    whole_lines(by_rank=argv[:1] == [LAUNCHER])  # a launcher writes the lines of its ranks
    if argv[:1] == [INSTALL]:
        from .install import install_main

        return install_main(argv[1:])
    if argv[:1] == [REAP] and len(argv) == 3:  # a job's entrypoint: the runtime beneath the pinned subreaper
        from .launch import runtime_script
        from .reaper import reap_main

        return reap_main(runtime_script(), argv[1:])
    if argv[:1] == [LAUNCHER] and len(argv) >= 3:
        from .launcher import launcher_main

        return launcher_main(argv[1:])
    rank = len(argv) == 3 and argv[1] == RANK_RESULTS
    if len(argv) != 2 and not rank:
        print(USAGE, file=sys.stderr)
        return EXIT_BAD_ENVELOPE
    secondary = not rank and is_secondary()  # a copy of the task process, started again by the task's code
    result_to = None if secondary else rank_result_path(argv[2]) if rank else argv[1]
    if secondary:
        split_output(framework_rank() or 0)
        announce_secondary()
    try:
        envelope = load_envelope(argv[0])
        unpack_modules(envelope)
    except (OSError, KeyError, ValueError) as exc:
        say(f"{PREFIX} unusable task envelope {argv[0]!r}: {exc}", stderr=True)
        if result_to is not None:
            write_result(result_to, {"ok": False, "error": error_record(exc)})
        return EXIT_BAD_ENVELOPE
    if secondary and refuse_copy((envelope.get("summary") or {}).get("share")):
        return EXIT_USER_ERROR
    return run(envelope, argv[0], result_to, rank=rank or secondary)


if __name__ == "__main__":
    sys.exit(main())
