"""Every way the runtime is started runs it: its archive as a script, ``python -m airflow_gpu_runtime``, the
unpacked package, the Kubernetes launcher, ``accelerate launch`` on the archive, and a library that starts the
process again as PyTorch Lightning's ``ddp`` does.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from shipped_runtime import callable_envelope, run_runtime, runtime_path

from airflow_gpu_provider.backends.kubernetes.container import BOOTSTRAP_ENV, LAUNCHER, bootstrap_payload
from airflow_gpu_provider.task.callable import shipped_callable
from airflow_gpu_provider.task.runtime_zip import archive

SUMMARY = {"backend": "test", "image": "img", "requirements_hash": "none", "resources": "cpu", "gpus": []}
# A launcher of two ranks, as accelerate's is for the runtime: ``python -m fake_launcher SCRIPT ARGS...``
FAKE_LAUNCHER = """
import os, subprocess, sys
ranks = [
    subprocess.run([sys.executable, *sys.argv[1:]], env={**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank)})
    for rank in range(2)
]
sys.exit(max(rank.returncode for rank in ranks))
"""


def where_am_i(tag):
    import os
    import sys

    return {"tag": tag, "argv0": sys.argv[0], "rank": os.environ.get("RANK"), "pid": os.getpid()}


def world_size():
    from accelerate import Accelerator

    accelerator = Accelerator()
    return {
        "world_size": accelerator.num_processes,
        "rank": accelerator.process_index,
        "backend": accelerator.state.backend,
    }


def starts_again_as_lightning_does():
    """PyTorch Lightning's ddp launcher (``_basic_subprocess_cmd``) starts each other rank with this command."""
    import os
    import subprocess
    import sys

    import __main__

    if os.environ.get("STARTED_AGAIN"):
        return "again"
    if __main__.__spec__ is None:
        command = [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]
    else:
        command = [sys.executable, "-m", __main__.__spec__.name, *sys.argv[1:]]
    environment = {**os.environ, "STARTED_AGAIN": "1"}
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=60)
    return {"status": done.returncode, "out": done.stdout, "err": done.stderr[-3000:]}


def envelope_file(tmp_path: Path, function, *args, **extra) -> Path:
    envelope = {**callable_envelope(shipped_callable(function, owner="test"), list(args), {}), "summary": SUMMARY}
    path = tmp_path / "envelope.json"
    path.write_text(json.dumps({**envelope, **extra}))
    return path


def run(argv: list[str], tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, env={**os.environ, **env}, cwd=tmp_path)
    result = tmp_path / "result.json"
    assert result.exists(), done.stdout + done.stderr
    return done, json.loads(result.read_text())


def test_the_archive_as_a_script(tmp_path):
    done, result = run(
        [sys.executable, str(runtime_path()), str(envelope_file(tmp_path, where_am_i, "pyz")), "result.json"], tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert result["return_value"]["argv0"] == str(runtime_path())  # the archive's path, as a script's
    assert done.stdout.splitlines()[0] == "[gpu] backend=test image=img requirements=none"


def test_a_jobs_subreaper_imports_nothing_else_of_the_runtime(tmp_path):
    """``runtime.pyz reap``: the subreaper imports its own module alone; the runtime beneath it imports the rest."""
    envelope = str(envelope_file(tmp_path, where_am_i, "reap"))
    os.symlink(runtime_path(), tmp_path / "runtime.pyz")  # as a Slurm job runs it: by a relative path
    done, result = run([sys.executable, "-X", "importtime", "runtime.pyz", "reap", envelope, "result.json"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert result["return_value"]["argv0"] == str(tmp_path / "runtime.pyz")  # the runtime ran, by the archive's path
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert {name for name in imported if name.startswith("airflow_gpu_runtime")} == {
        "airflow_gpu_runtime",
        "airflow_gpu_runtime.reaper",
    }
    assert "typing" not in imported  # the package's annotations need it only under a type checker


SUBREAPER = """
import subprocess, sys
from airflow_gpu_provider.runtime import reaper

walk = reaper._children
reaper._children = lambda: sys.exit("walked every process with no child left")
assert reaper.stop_all(0.1) == []
child = subprocess.Popen(["sleep", "60"])
reaper._children = walk
assert reaper.stop_all(5) == [] and reaper._stat(child.pid) is None  # stopped, and reaped
"""


def test_the_subreaper_looks_for_descendants_only_while_it_has_a_child():
    done = subprocess.run([sys.executable, "-c", SUBREAPER], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_python_m_with_the_archive_on_the_path(tmp_path):
    envelope = envelope_file(tmp_path, where_am_i, "-m")
    argv = [sys.executable, "-m", "airflow_gpu_runtime", str(envelope), "result.json"]
    done, result = run(argv, tmp_path, PYTHONPATH=str(runtime_path()))
    assert done.returncode == 0, done.stderr
    assert result["return_value"]["tag"] == "-m"
    assert "[gpu] where_am_i() finished in" in done.stdout


def test_the_unpacked_package_and_its_ranks(tmp_path):
    """``python -m airflow_gpu_provider.runtime`` (an image with the provider installed): its ranks run its
    ``__main__.py`` as a file, which finds its package."""
    (tmp_path / "fake_launcher.py").write_text(FAKE_LAUNCHER)
    envelope = envelope_file(tmp_path, where_am_i, "unpacked", launch={"module": "fake_launcher", "args": []})
    argv = [sys.executable, "-m", "airflow_gpu_provider.runtime", str(envelope), "result.json"]
    done, result = run(argv, tmp_path, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    assert done.returncode == 0, done.stderr
    main = REPO / "airflow_gpu_provider" / "runtime" / "__main__.py"
    # the launcher runs in a runtime process of its own (which names failed ranks), the ranks from the same file
    assert re.search(
        rf"{re.escape(str(main))} launcher \S+/failures.json fake_launcher {main} {envelope} ", done.stdout
    )
    assert result["ranks"] == 2 and result["return_value"]["rank"] == "0"
    assert "[gpu] rank 1: where_am_i() finished" in done.stdout


def test_the_archive_starts_its_ranks_from_the_archive(tmp_path):
    (tmp_path / "fake_launcher.py").write_text(FAKE_LAUNCHER)
    envelope = envelope_file(tmp_path, where_am_i, "ranks", launch={"module": "fake_launcher", "args": []})
    done, result = run(
        [sys.executable, str(runtime_path()), str(envelope), "result.json"], tmp_path, PYTHONPATH=str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    archive = re.escape(str(runtime_path()))
    assert re.search(rf"{archive} launcher \S+/failures.json fake_launcher {archive} {envelope} ", done.stdout)
    assert result["ranks"] == 2 and result["return_value"]["argv0"] == str(runtime_path())


def test_the_kubernetes_launcher_writes_the_archive_and_runs_it(tmp_path):
    """The pod's ``python3 -c`` launcher, run here: the archive from the environment variable, the same bytes."""
    envelope = envelope_file(tmp_path, where_am_i, "pod")
    environment = {BOOTSTRAP_ENV: bootstrap_payload(), "TMPDIR": str(tmp_path)}
    done, result = run([sys.executable, "-c", LAUNCHER, str(envelope), "result.json"], tmp_path, **environment)
    assert done.returncode == 0, done.stderr
    written = Path(result["return_value"]["argv0"])
    assert written.parent == tmp_path and written.read_bytes() == archive()


def test_the_kubernetes_launcher_runs_the_installer(tmp_path):
    """The init container's form: ``install`` first, then the install's own arguments (here: bad ones)."""
    environment = {BOOTSTRAP_ENV: bootstrap_payload()}
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, "install", str(tmp_path / "deps"), "pip", "--", "/nonexistent/requirement.whl"],
        capture_output=True, text=True, timeout=120, env={**os.environ, **environment},
    )  # fmt: skip
    assert done.returncode == 1
    assert "[gpu] $ " in done.stdout and "-m pip install" in done.stdout
    assert "failed with exit status" in done.stderr


def test_usage(tmp_path):
    done = run_runtime("only-one-argument", timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("usage: runtime.pyz ENVELOPE RESULT")


@pytest.mark.parametrize("how", ["pyz", "-m", "kubernetes"])
def test_a_library_that_starts_the_process_again_runs_the_runtime_again(tmp_path, how):
    envelope = envelope_file(tmp_path, starts_again_as_lightning_does)
    env: dict[str, str] = {}
    if how == "pyz":
        argv = [sys.executable, str(runtime_path())]
    elif how == "-m":
        argv, env = [sys.executable, "-m", "airflow_gpu_runtime"], {"PYTHONPATH": str(runtime_path())}
    else:
        argv, env = [sys.executable, "-c", LAUNCHER], {BOOTSTRAP_ENV: bootstrap_payload(), "TMPDIR": str(tmp_path)}
    done, result = run([*argv, str(envelope), "result.json"], tmp_path, **env)
    assert done.returncode == 0, done.stderr
    again = result["return_value"]
    assert again["status"] == 0, again["err"]
    assert "[gpu] starts_again_as_lightning_does() finished" in again["out"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_accelerate_launch_runs_the_archive_on_two_cpu_processes(tmp_path):
    """``accelerate launch ... runtime.pyz ENVELOPE --rank-results DIR``: each rank is the runtime, world size 2."""
    envelope = envelope_file(tmp_path, world_size)
    accelerate = Path(sys.executable).with_name("accelerate")
    argv = [
        str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--main_process_port", str(_free_port()), str(runtime_path()), str(envelope), "--rank-results", "ranks",
    ]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "ACCELERATE_USE_CPU": "1"}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [json.loads((tmp_path / "ranks" / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["return_value"] for r in ranks] == [
        {"world_size": 2, "rank": rank, "backend": "gloo"} for rank in (0, 1)
    ], ranks
    assert "[gpu] rank 1: world_size() finished" in done.stdout


def test_the_archive_holds_the_runtime_under_its_own_name():
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(archive())) as shipped:
        names = shipped.namelist()
        root = shipped.read("__main__.py").decode()
    assert names[0] == "__main__.py" and all(n.startswith("airflow_gpu_runtime/") for n in names[1:])
    assert "airflow_gpu_runtime/protocol.py" in names and "airflow_gpu_runtime/telemetry/sampler.py" in names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    assert "from airflow_gpu_runtime.__main__ import main" in root
    with zipfile.ZipFile(runtime_path()) as local:  # the local backend's copy: each module compiled beside it
        assert local.namelist() == [*names, *(f"{name}c" for name in names)]
