"""The runtime, run for real as a child process from its archive (``runtime.pyz``), exactly as backends run it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from shipped_runtime import callable_envelope, command_envelope, run_runtime, runtime_path, shipped

from airflow_gpu_provider.task.callable import shipped_callable

SUMMARY = {"backend": "test", "image": "img", "requirements_hash": "abc123", "resources": "1x nvidia GPU", "gpus": []}


def add(a, b, scale=1):
    return {"sum": (a + b) * scale, "pid": __import__("os").getpid()}


def explode(message):
    values = {"message": message}
    raise ValueError(values["message"])  # LINE_OF_RAISE


def returns_object():
    return object()


def returns_nan():
    return {"loss": float("nan")}


def exits(code):
    import sys

    sys.exit(code)


def classes_under_the_future_import(rate):
    """This file has ``from __future__ import annotations``: the function's body is compiled with it too."""
    import dataclasses
    import typing

    @dataclasses.dataclass(frozen=True)
    class Config:
        rate: float
        layers: int = 2

    return {
        "config": dataclasses.asdict(Config(rate)),
        "field_types": [field.type for field in dataclasses.fields(Config)],  # strings, as in this file
        "hints": {name: hint.__name__ for name, hint in typing.get_type_hints(Config).items()},  # its module's
    }


def run_envelope(
    tmp_path: Path, envelope: dict, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, dict | None]:
    envelope = {**envelope, "summary": SUMMARY}
    path = tmp_path / "envelope.json"
    path.write_text(json.dumps(envelope))
    result = tmp_path / "result.json"
    proc = run_runtime(str(path), str(result), env={**os.environ, **(env or {})}, timeout=60)
    return proc, (json.loads(result.read_text()) if result.exists() else None)


def envelope_for(function, *args, **kwargs) -> dict:
    return callable_envelope(shipped_callable(function, owner="test"), list(args), kwargs)


def test_callable_result_and_summary_first(tmp_path):
    proc, result = run_envelope(tmp_path, envelope_for(add, 2, 3, scale=10))
    assert proc.returncode == 0, proc.stderr
    assert result["ok"] is True
    assert result["return_value"]["sum"] == 50
    assert result["return_value"]["pid"] != os.getpid()
    lines = proc.stdout.splitlines()
    assert lines[0] == "[gpu] backend=test image=img requirements=abc123"
    assert lines[1] == "[gpu] resources: 1x nvidia GPU"
    assert lines[2] == "[gpu] GPUs assigned: none (running on CPU)"
    assert lines[3] == "[gpu] CUDA cache before task: skipped (torch is not loaded)"
    assert "add() finished in" in lines[4]
    assert result["cache"][0]["status"] == "skipped"


def test_a_dataclass_in_the_function_under_the_dag_files_future_import(tmp_path):
    proc, result = run_envelope(tmp_path, envelope_for(classes_under_the_future_import, 0.5))
    assert result is not None and result["ok"], proc.stderr
    assert result["return_value"] == {
        "config": {"rate": 0.5, "layers": 2},
        "field_types": ["float", "int"],
        "hints": {"rate": "float", "layers": "int"},
    }


def test_exception_traceback_points_at_the_dag_file_line(tmp_path):
    proc, result = run_envelope(tmp_path, envelope_for(explode, "boom"))
    assert proc.returncode == 1
    assert result["ok"] is False
    assert result["error"]["type"] == "ValueError"
    assert result["error"]["message"] == "boom"
    raise_line = next(
        i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if "# LINE_OF_RAISE" in line
    )
    expected = f'File "{__file__}", line {raise_line}, in explode'
    assert expected in result["error"]["traceback"]
    assert "raise ValueError(values" in result["error"]["traceback"]  # the source line is shown too
    assert "airflow_gpu_runtime" not in result["error"]["traceback"]  # it starts at the user's code
    # the log gets one line; the worker logs the traceback from the result, once, at ERROR
    assert "[gpu] the task raised ValueError: boom" in proc.stderr and "Traceback" not in proc.stderr


def test_non_json_return_value_is_one_line_naming_the_key_and_the_fix(tmp_path):
    proc, result = run_envelope(tmp_path, envelope_for(returns_object))
    assert proc.returncode == 1
    said = "the return value of returns_object() cannot travel back as JSON: it is an object. Return None, bool, "
    assert result["error"]["message"].startswith(said) and ".tolist()" in result["error"]["message"]
    assert result["error"]["traceback"] == "" and "Traceback" not in proc.stderr  # nothing raised: no traceback
    assert proc.stderr.count("cannot travel back as JSON") == 1
    proc, result = run_envelope(tmp_path, envelope_for(returns_nan))  # json.dumps writes NaN; XCom would refuse it
    assert proc.returncode == 1
    assert "cannot travel back as JSON: ['loss'] is nan (not finite)" in result["error"]["message"]


@pytest.mark.parametrize(("code", "status", "ok"), [(0, 0, True), (None, 0, True), (3, 1, False)])
def test_sys_exit_in_user_code(tmp_path, code, status, ok):
    proc, result = run_envelope(tmp_path, envelope_for(exits, code))
    assert proc.returncode == status
    assert result["ok"] is ok


def test_command_mode_execs_and_propagates_exit_status(tmp_path):
    proc, result = run_envelope(
        tmp_path, command_envelope([sys.executable, "-c", "print('hello'); raise SystemExit(7)"])
    )
    assert proc.returncode == 7
    assert proc.stdout.splitlines()[0].startswith("[gpu] backend=test")
    assert "hello" in proc.stdout
    assert result == {"ok": True, "return_value": None}  # written before the exec: the exit status decides


def test_command_not_found(tmp_path):
    proc, result = run_envelope(tmp_path, command_envelope(["/nonexistent/binary"]))
    assert proc.returncode == 127
    assert result["ok"] is False


def test_envelope_from_environment_variable(tmp_path):
    envelope = {**envelope_for(add, 1, 1), "summary": SUMMARY}
    encoded = base64.b64encode(json.dumps(envelope).encode()).decode()
    result_path = tmp_path / "out" / "result.json"
    proc = run_runtime(
        "env:GPU_TASK_ENVELOPE", str(result_path), env={**os.environ, "GPU_TASK_ENVELOPE": encoded}, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(result_path.read_text())["return_value"]["sum"] == 2


def test_unusable_envelope_exits_2_with_an_error_result(tmp_path):
    path = tmp_path / "envelope.json"
    path.write_text(json.dumps({"version": 99}))
    proc = run_runtime(str(path), str(tmp_path / "r.json"), timeout=60)
    assert proc.returncode == 2
    assert "envelope version 99" in proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is False


def test_only_rank_zero_writes_the_result(tmp_path):
    proc, result = run_envelope(tmp_path, envelope_for(add, 1, 2), env={"RANK": "1"})
    assert proc.returncode == 0
    assert result is None


def test_runtime_is_stdlib_only():
    """It must run in any image with python3: importing every module of the archive loads only the stdlib."""
    code = (
        "import sys, zipfile, importlib; before = set(sys.modules); path = sys.argv[1]; sys.path.insert(0, path); "
        "names = [n[:-3].replace('/', '.').removesuffix('.__init__') for n in zipfile.ZipFile(path).namelist() "
        "if n.endswith('.py')]; "
        "[importlib.import_module(n) for n in names if n != '__main__']; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(m for m in new if m not in sys.stdlib_module_names and not m.startswith('_')))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code, str(runtime_path())], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "['airflow_gpu_runtime']"


def test_clear_cuda_cache_with_torch_loaded_and_no_gpu_visible():
    """torch in the test process sees no GPU on any host (conftest: CUDA_VISIBLE_DEVICES="")."""
    import torch  # noqa: F401 - loaded on purpose

    result = shipped("cuda").clear_cuda_cache()
    assert result["status"] == "skipped"
    assert result["reason"] == "CUDA is not available"
    assert result["freed_bytes"] == 0


def fills_the_cuda_cache(megabytes):
    import torch

    block = torch.empty(megabytes * 2**20, dtype=torch.uint8, device="cuda")
    del block  # freed, but kept by the caching allocator
    return torch.cuda.memory_reserved()


@pytest.mark.gpu
def test_the_runtime_clears_the_cuda_cache_after_the_task_on_a_gpu(tmp_path):
    from gpu_support import nvidia_gpus

    from airflow_gpu_provider.settings.units import format_bytes

    first_gpu = nvidia_gpus()[0][0]
    proc, result = run_envelope(
        tmp_path, envelope_for(fills_the_cuda_cache, 64), env={"CUDA_VISIBLE_DEVICES": first_gpu}
    )
    assert proc.returncode == 0, proc.stderr
    held = result["return_value"]
    assert held >= 64 * 2**20
    before, after = result["cache"]
    assert before["reason"] == "torch is not loaded"  # nothing to clear before the task
    assert (after["status"], after["freed_bytes"]) == ("cleared", held)
    assert f"CUDA cache after task: cleared, {format_bytes(held)} freed" in proc.stdout


def test_result_to_the_log_when_no_file_can_travel_back(tmp_path):
    envelope = {**envelope_for(add, 2, 2), "summary": SUMMARY}
    path = tmp_path / "envelope.json"
    path.write_text(json.dumps(envelope))
    proc = run_runtime(str(path), "-", timeout=60)
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("[gpu] result: ")
    assert json.loads(last.removeprefix("[gpu] result: "))["return_value"]["sum"] == 4


def test_a_rank_reports_into_the_rank_folder(tmp_path):
    envelope = {**envelope_for(add, 1, 2), "summary": SUMMARY}
    path = tmp_path / "envelope.json"
    path.write_text(json.dumps(envelope))
    proc = run_runtime(
        str(path), "--rank-results", str(tmp_path / "ranks"), env={**os.environ, "RANK": "3"}, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "[gpu] backend=" not in proc.stdout  # the summary is the launcher's, printed once
    assert "[gpu] rank 3: add() finished" in proc.stdout
    assert json.loads((tmp_path / "ranks" / "rank3.json").read_text())["return_value"]["sum"] == 3


@pytest.mark.parametrize(
    ("version", "variable"),
    [
        ("0.10.9", "UV_NATIVE_TLS"),
        ("0.11.0", "UV_SYSTEM_CERTS"),
        ("uv 0.13.9 (x86_64-unknown-linux-gnu)", "UV_SYSTEM_CERTS"),
    ],
)
def test_ca_variable_follows_the_uv_version(version, variable):
    assert shipped("protocol").uv_ca_variable(version) == variable
