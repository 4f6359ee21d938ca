"""A failed try's task log, read as Airflow writes it (a worker process running ``dag.test()``; its log is the task log).

The user's traceback is logged once, at ERROR, where the UI's error filter shows it; the launcher adds no traceback
of its own and no defaults warning; a rank that was killed is named with its signal.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO
from helpers import alive, start_worker, worker_result

DAG_FILE = REPO / "tests" / "dags" / "output_dags.py"
SCRIPT = REPO / "tests" / "scripts" / "failing_script.py"
RECORD = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z \[(\w+)\s*\] ", re.MULTILINE)

pytestmark = pytest.mark.usefixtures("airflow_home")


def records(log: str) -> list[tuple[str, str]]:
    """``(level, text)`` of each record of a task log (a record's text runs to the next record)."""
    starts = list(RECORD.finditer(log))
    ends = [m.start() for m in starts[1:]] + [len(log)]
    return [(m[1], log[m.end() : end]) for m, end in zip(starts, ends, strict=True)]


def run(dag_id: str, conf: dict | None = None) -> tuple[dict, list[tuple[str, str]], str]:
    worker = start_worker(DAG_FILE, dag_id, conf=conf)
    log, _ = worker.communicate(timeout=600)
    return worker_result(log), records(log), log


def line_of(path: Path, marker: str) -> int:
    return next(number for number, text in enumerate(path.read_text().splitlines(), 1) if marker in text)


def test_a_function_traceback_is_logged_once_at_error() -> None:
    result, logged, log = run("output_function")
    assert result["states"] == {"function": "failed"}, log[-3000:]
    frame = f'File "{DAG_FILE}", line {line_of(DAG_FILE, "# FUNCTION_RAISE_LINE")}, in load'
    with_frame = [(level, text) for level, text in logged if frame in text]
    assert [level for level, _ in with_frame] == ["error"], log[-5000:]  # once, at ERROR
    traceback = with_frame[0][1]
    assert traceback.startswith("Traceback (most recent call last):")
    assert "FileNotFoundError: no data at /data/train.parquet" in traceback
    assert "airflow_gpu_runtime" not in traceback  # it starts at the user's code
    assert "[gpu] the task raised FileNotFoundError: no data at /data/train.parquet" in log  # the runtime's one line
    failure = next(text for level, text in logged if text.startswith("Task failed with exception"))
    assert "The task raised FileNotFoundError in the local task process" in failure


def test_a_command_traceback_is_logged_at_error() -> None:
    result, logged, log = run("output_command")
    assert result["states"] == {"command": "failed"}, log[-3000:]
    frame = f'File "{SCRIPT}", line {line_of(SCRIPT, "# SCRIPT_RAISE_LINE")}, in <module>'
    with_frame = [(level, text) for level, text in logged if frame in text]
    assert [level for level, _ in with_frame] == ["error"], log[-5000:]
    assert "ValueError: the script failed on rank 0" in with_frame[0][1]


def test_a_launch_logs_the_rank_traceback_once_names_killed_ranks_and_adds_no_noise(tmp_path: Path) -> None:
    result, logged, log = run("output_accelerate", conf={"pid_dir": str(tmp_path)})
    assert result["states"] == {
        "raising_rank": "failed",
        "killed_script_rank": "failed",
        "raising_script": "failed",
    }, log[-3000:]
    # the function's rank: its traceback once, at ERROR; the message names the rank
    frame = f'File "{DAG_FILE}", line {line_of(DAG_FILE, "# RANK_RAISE_LINE")}, in one_rank_raises'
    assert [level for level, text in logged if frame in text] == ["error"], log[-8000:]
    said = "[rank 1] [gpu] rank 1: the task raised RuntimeError: rank 1 cannot go on"  # whole, with its rank
    assert [level for level, text in logged if text.startswith(said)] == ["info"], log[-8000:]
    assert "The task raised RuntimeError in the local task process: rank 1: rank 1 cannot go on" in log
    # the script whose rank 1 was killed: named with its pid and signal, in the task's failure
    pids = {int((tmp_path / f"rank{rank}").read_text()) for rank in (0, 1)}
    killed = int((tmp_path / "rank1").read_text())
    failures = [text for level, text in logged if text.startswith("Task failed with exception")]
    assert any(f"rank 1 (pid {killed}) was killed by SIGKILL" in text for text in failures), log[-8000:]
    assert not any(alive(pid) for pid in pids)
    # a script's own traceback (one process): at ERROR, once
    frame = f'File "{SCRIPT}", line {line_of(SCRIPT, "# SCRIPT_RAISE_LINE")}, in <module>'
    assert [level for level, text in logged if frame in text] == ["error"], log[-8000:]
    # no launcher noise: neither accelerate's traceback, nor torch elastic's table, nor the defaults warning
    for noise in ("ChildFailedError", "CalledProcessError", "had defaults used instead", "Root Cause"):
        assert noise not in log, noise


def test_a_mapped_sweep_read_by_a_gpu_task_logs_no_error_and_a_bad_return_one_short_failure() -> None:
    """Issue 36: a GPU task took no mapped task's results, a successful sweep logged Airflow's ``XCom not found``,
    and a non-JSON return printed the JSON encoder's traceback and the provider's, without the key, then a
    ``Retry policy decision action=retry`` on a task that has no retries."""
    result, logged, log = run("output_quiet")
    assert result["states"] == {"square": "success", "best": "success", "unsendable": "failed"}, log[-3000:]
    assert result["xcom"]["best"] == {"x": 1, "loss": 1}
    assert "XCom not found" not in log and not [text for level, text in logged if level == "error" and "best" in text]
    start, end = log.index("starting task_id=unsendable"), log.index("end task task_id=unsendable")
    failed = records(log[start:end])
    fix = "the return value of returns_a_set() cannot travel back as JSON: ['metrics']['loss'] is a set. Return "
    assert sum(fix in text for _, text in failed) == 2, log[start:end]  # the runtime's line, the task's failure
    for noise in ("direct cause", "json/encoder.py", "Retry policy decision", "backends/local/backend.py"):
        assert noise not in log[start:end], noise
    assert len(log[start:end].splitlines()) < 60, log[start:end]
