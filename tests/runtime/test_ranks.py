"""Ranks the task's own code starts, as PyTorch Lightning's ``ddp`` does: ``sys.executable sys.argv...`` again,
with ``LOCAL_RANK`` set. The copies are secondary ranks (no summary, no result); rank 0's value is the task's; a
copy still running when rank 0 returns is ended and named. Real processes, the shipped archive.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from shipped_runtime import callable_envelope, runtime_path

from airflow_gpu_provider.task.callable import shipped_callable

SUMMARY = {"backend": "test", "image": "img", "requirements_hash": "none", "resources": "cpu", "gpus": []}


def starts_ranks(ranks, rank_sleeps):
    """Start ``ranks - 1`` copies of this process as Lightning's ddp does, then return rank 0's value.

    A copy (``LOCAL_RANK`` > 0) sleeps ``rank_sleeps`` seconds, then returns its own value.
    """
    import os
    import subprocess
    import sys
    import time

    rank = int(os.environ.get("LOCAL_RANK", "0"))
    if rank > 0:
        time.sleep(rank_sleeps)
        return {"rank": rank}
    os.environ["LOCAL_RANK"] = "0"  # Lightning sets the main process's rank too
    for local_rank in range(1, ranks):
        command = [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]
        subprocess.Popen(command, env={**os.environ, "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(ranks)})
    time.sleep(0.5)  # the copies have started
    return {"rank": rank, "pid": os.getpid()}


def copy_fails():
    import os
    import subprocess
    import sys

    if os.environ.get("LOCAL_RANK", "0") != "0":
        raise ValueError("rank 1 broke")
    command = [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]
    done = subprocess.run(command, env={**os.environ, "LOCAL_RANK": "1"}, timeout=60)
    return {"copy_status": done.returncode}


def prints_with_a_copy(lines, killed):
    """Rank 0 and a copy print at once, unbuffered. With ``killed``, the copy is SIGKILLed (the kernel's OOM killer);
    then, as Lightning's observer does, rank 0's launcher kills rank 0 too."""
    import os
    import signal
    import subprocess
    import sys
    import time

    rank = os.environ.get("LOCAL_RANK", "0")
    if rank == "0":
        command = [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]
        copy = subprocess.Popen(command, env={**os.environ, "LOCAL_RANK": "1", "WORLD_SIZE": "2"})
        while not os.path.exists("copy-started"):
            time.sleep(0.01)
    else:
        open("copy-started", "w").close()
    for line in range(lines):
        print(f"rank {rank} line {line}", "x" * 200)
        time.sleep(0.0005)
    if rank != "0" and killed:
        time.sleep(1)  # a rank the OOM killer ends has run a while: the watch, which looks every 0.2 s, has seen it
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == "0" and killed:
        time.sleep(3)  # Lightning's observer looks every 5 s
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == "0":
        copy.wait()


def _run(tmp_path: Path, function, *args) -> tuple[subprocess.CompletedProcess[str], dict]:
    envelope = {**callable_envelope(shipped_callable(function, owner="test"), list(args), {}), "summary": SUMMARY}
    (tmp_path / "envelope.json").write_text(json.dumps(envelope))
    done = subprocess.run(
        [sys.executable, str(runtime_path()), "envelope.json", "result.json"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip  # unbuffered, as every backend runs the task
    return done, json.loads((tmp_path / "result.json").read_text())


def test_copies_print_no_summary_and_rank_0s_value_is_the_result(tmp_path):
    done, result = _run(tmp_path, starts_ranks, 3, 1.5)
    assert done.returncode == 0, done.stderr
    assert result["ok"] and result["return_value"]["rank"] == 0, result
    assert done.stdout.count("[gpu] backend=test") == 1, done.stdout  # the summary, once
    assert done.stdout.count("(LOCAL_RANK=1 WORLD_SIZE=3); rank 0 reports the result") == 1, done.stdout
    assert done.stdout.count("(LOCAL_RANK=2 WORLD_SIZE=3); rank 0 reports the result") == 1, done.stdout
    # the copies ended by themselves within the wait (1.5 s): rank 0 waited for them, killed none
    assert "[gpu] rank 1: starts_ranks() finished" in done.stdout
    assert "[gpu] rank 2: starts_ranks() finished" in done.stdout
    assert "killed" not in done.stderr, done.stderr


def test_a_rank_still_running_after_rank_0_returned_is_ended_and_named(tmp_path):
    done, result = _run(tmp_path, starts_ranks, 2, 300)
    assert done.returncode == 0, done.stderr
    assert result["return_value"]["rank"] == 0
    lines = [line for line in done.stderr.splitlines() if "killed with" in line]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("[gpu] rank 1 (pid ")
    assert lines[0].endswith("was still running 30s after rank 0's function returned: killed with SIGTERM")
    pid = int(lines[0].split("(pid ")[1].split(")")[0])
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_a_failing_copy_reports_in_the_log_and_writes_no_result(tmp_path):
    done, result = _run(tmp_path, copy_fails)
    assert done.returncode == 0, done.stderr
    assert result["return_value"] == {"copy_status": 1}  # rank 0's value: the copy's result file is never written
    assert "ValueError: rank 1 broke" in done.stderr


def test_a_copy_killed_first_is_named_though_its_launcher_then_kills_rank_0(tmp_path):
    """Rank 0 is killed by its own launcher, which leaves no room to say why: the watch named the cause at once."""
    from airflow_gpu_provider.exceptions import RemoteTaskError
    from airflow_gpu_provider.task.result import task_result

    done, result = _run(tmp_path, prints_with_a_copy, 1, True)
    assert done.returncode == -9
    killed = re.search(
        r"^\[gpu\] rank 1 \(pid (\d+)\) was killed by SIGKILL, the first rank to fail$", done.stderr, re.M
    )
    assert killed, done.stderr
    with pytest.raises(RemoteTaskError) as failed:
        task_result(result, done.returncode, where="the test")
    assert str(failed.value) == f"The task failed in the test: rank 1 (pid {killed[1]}) was killed by SIGKILL."
    assert result["failure"]["class"] == "application"


def test_every_line_of_rank_0_and_of_a_copy_is_whole_and_the_copys_names_its_rank(tmp_path):
    done, result = _run(tmp_path, prints_with_a_copy, 400, False)
    assert result["ok"], done.stderr
    lines = done.stdout.splitlines()
    assert [n for n in lines if "rank 0 line" in n] == [f"rank 0 line {i} " + "x" * 200 for i in range(400)]
    assert [n for n in lines if "rank 1 line" in n] == [f"[rank 1] rank 1 line {i} " + "x" * 200 for i in range(400)]
    assert "[rank 1] [gpu] rank 1: prints_with_a_copy() finished in " in done.stdout


def prints_in_pieces_with_a_copy(lines):
    """Rank 0 and a copy each write every line in three flushed pieces, as a progress report does."""
    import os
    import subprocess
    import sys
    import time

    rank = os.environ.get("LOCAL_RANK", "0")
    copy = None
    if rank == "0":
        command = [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]
        copy = subprocess.Popen(command, env={**os.environ, "LOCAL_RANK": "1", "WORLD_SIZE": "2"})
    for line in range(lines):
        print(f"rank {rank} step {line}:", end="", flush=True)
        time.sleep(0.001)
        print(" loss", end="", flush=True)
        print(f" {line}.5")
    if copy is not None:
        copy.wait()


def test_a_line_flushed_in_pieces_is_whole_whatever_the_other_rank_writes(tmp_path):
    done, result = _run(tmp_path, prints_in_pieces_with_a_copy, 200)
    assert result["ok"], done.stderr
    lines = done.stdout.splitlines()
    assert [n for n in lines if "rank 0 step" in n] == [f"rank 0 step {i}: loss {i}.5" for i in range(200)]
    assert [n for n in lines if "rank 1 step" in n] == [f"[rank 1] rank 1 step {i}: loss {i}.5" for i in range(200)]


PIECES_SCRIPT = """
import os, sys, time
rank = os.environ["RANK"]
for line in range(100):
    print(f"rank {rank} step {line}:", end="", flush=True)
    time.sleep(0.002)
    print(f" loss {line}.5", flush=True)
print("no line end", end="", flush=True)
"""


def test_a_launchs_ranks_lines_flushed_in_pieces_are_whole(tmp_path):
    """The launcher (torch elastic's ``--tee``, as ``accelerate launch`` runs it) joins each rank's pieces first."""
    (tmp_path / "pieces.py").write_text(PIECES_SCRIPT)
    done = subprocess.run(
        [
            sys.executable, str(runtime_path()), "launcher", str(tmp_path / "failures.json"), "torch.distributed.run",
            "--standalone", "--nproc-per-node", "2", "--tee", "3", "--log-dir", str(tmp_path / "logs"),
            str(tmp_path / "pieces.py"),
        ],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank ${rank}] "},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for rank in (0, 1):
        mine = [n for n in lines if f"rank {rank} step" in n or n.startswith(f"[rank {rank}] no line")]
        expected = [f"[rank {rank}] rank {rank} step {i}: loss {i}.5" for i in range(100)]
        assert mine == [*expected, f"[rank {rank}] no line end"], done.stdout[-3000:]
