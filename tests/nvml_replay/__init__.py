"""NVML on machines without a GPU: ``libnvidia-ml.so.1`` built from ``nvml_replay.c``, replaying a recording.

A recording is what ``scripts/record_nvml.py`` (nvidia-smi) writes on a GPU machine; ``recordings/`` holds some.
A test builds the library once and starts its process with the replay's environment::

    lib_dir = build(tmp_path_factory.mktemp("nvml"))
    env = {**os.environ, **replay_environment(RECORDINGS / "rtx4090_1gpu.csv", lib_dir)}
    subprocess.run([sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"], env=env, check=True)

The environment must be the process's own from its start: the dynamic loader reads ``LD_LIBRARY_PATH`` once, so
setting it in a running process does not make ``ctypes.CDLL("libnvidia-ml.so.1")`` find the replay.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("nvml_replay.c")
RECORDINGS = Path(__file__).with_name("recordings")
LIBRARY = "libnvidia-ml.so.1"


class ReplayBuildError(RuntimeError):
    """The replay library could not be compiled."""


def build(dest_dir: Path) -> Path:
    """Compile the replay into ``dest_dir/libnvidia-ml.so.1`` (kept while the source is unchanged); ``dest_dir``."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    library, stamp = dest_dir / LIBRARY, dest_dir / f"{LIBRARY}.sha256"
    if library.is_file() and stamp.is_file() and stamp.read_text() == digest:
        return dest_dir
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ReplayBuildError("the NVML replay needs gcc, and none is on PATH: install it (apt-get install gcc)")
    dest_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-o", str(library), str(SOURCE)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ReplayBuildError(f"gcc could not build the NVML replay from {SOURCE}:\n{done.stderr}")
    stamp.write_text(digest)
    return dest_dir


def replay_environment(recording: Path, lib_dir: Path) -> dict[str, str]:
    """The variables that make a new process load the replay of ``recording`` as NVML."""
    search_path = [str(lib_dir), *filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep))]
    return {"LD_LIBRARY_PATH": os.pathsep.join(search_path), "NVML_REPLAY_FILE": str(recording)}


def built_or_skip(dest_dir: Path) -> Path:
    """:func:`build` for a test: without gcc the test skips saying why, except in CI (``CI=true``), where it fails."""
    import pytest

    try:
        return build(dest_dir)
    except ReplayBuildError as err:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the NVML replay tests: {err}", pytrace=False)
        pytest.skip(f"the NVML replay cannot be built here: {err}")
