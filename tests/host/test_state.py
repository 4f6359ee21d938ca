"""The state dir as another local user would attack it: planted folders, symlinked lock files, "cached" venvs."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from airflow_gpu_provider.backends.local.venv import READY_MARKER, ensure_venv, venv_key
from airflow_gpu_provider.host.allocator import GpuAllocator
from airflow_gpu_provider.host.inventory import Device
from airflow_gpu_provider.host.state import UntrustedStateError, open_private, private_dir
from airflow_gpu_provider.settings import ImageSettings

log = logging.getLogger("test")
OTHER_UID = 4321


def _as_root():
    if os.geteuid() != 0:
        pytest.skip("making a folder that belongs to another user needs root")


def test_a_new_state_dir_is_created_private(tmp_path):
    folder = private_dir(tmp_path / "state" / "locks")
    assert stat.S_IMODE(os.lstat(folder).st_mode) & 0o077 == 0
    fd = open_private(folder / "x.lock")
    try:
        assert stat.S_IMODE(os.fstat(fd).st_mode) & 0o077 == 0
    finally:
        os.close(fd)


def test_a_folder_others_may_write_is_refused(tmp_path):
    planted = tmp_path / "state"
    planted.mkdir()
    planted.chmod(0o777)  # as a state dir pre-created in /var/tmp by another user would be
    with pytest.raises(UntrustedStateError, match="others may write to it"):
        private_dir(planted)


def test_a_state_dir_others_may_write_is_refused_for_the_folders_in_it(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)  # another user could rename "locks" away and put their own in its place
    with pytest.raises(UntrustedStateError, match=r"state: others may write to it \(mode 0777\) and replace locks"):
        private_dir(state / "locks")
    state.chmod(0o1777)  # sticky, as /var/tmp: nobody else may rename what the worker made
    assert private_dir(state / "locks").is_dir()


def test_missing_parents_of_the_state_dir_are_created_private(tmp_path):
    private_dir(tmp_path / "a" / "b" / "state" / "locks")
    for folder in ("a", "a/b", "a/b/state"):
        assert stat.S_IMODE(os.lstat(tmp_path / folder).st_mode) == 0o700


def test_a_folder_of_another_user_is_refused(tmp_path):
    _as_root()
    planted = tmp_path / "state"
    planted.mkdir(mode=0o755)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(UntrustedStateError, match=f"belongs to uid {OTHER_UID}"):
        private_dir(planted)


def test_a_symlinked_state_dir_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(elsewhere)
    with pytest.raises(UntrustedStateError, match="not a directory"):
        private_dir(tmp_path / "state")


def test_a_lock_file_symlinked_onto_a_victim_is_never_written(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    locks = private_dir(tmp_path / "state" / "locks")
    allocator = GpuAllocator(locks)
    allocator.lock_path(Device("0")).symlink_to(victim)
    with pytest.raises(UntrustedStateError, match="it is a symlink"):
        allocator.try_acquire([Device("0")], 1, "dag.task run r")
    assert victim.read_text() == "precious"
    with pytest.raises(UntrustedStateError, match="it is a symlink"):
        allocator.holder_of(Device("0"))


def test_a_fifo_in_place_of_a_lock_file_does_not_block(tmp_path):
    locks = private_dir(tmp_path / "locks")
    os.mkfifo(GpuAllocator(locks).lock_path(Device("0")), 0o600)
    with pytest.raises(UntrustedStateError, match="not a regular file"):
        GpuAllocator(locks).try_acquire([Device("0")], 1, "dag.task run r")


def test_lock_files_are_the_workers_alone(tmp_path):
    allocator = GpuAllocator(tmp_path / "locks")
    allocation = allocator.try_acquire([Device("0")], 1, "dag.task run r")
    assert allocation is not None
    try:
        mode = stat.S_IMODE(os.stat(allocator.lock_path(Device("0"))).st_mode)
        assert mode & 0o077 == 0  # no other user can open, hence flock, a GPU's lock
    finally:
        allocation.release()


def test_a_planted_venv_is_never_run(tmp_path):
    """A "cached" venv in a state dir another user could write: refused before its python could run."""
    image = ImageSettings(requirements=["tomli-w==1.0.0"])
    cache = tmp_path / "venvs"
    planted = cache / venv_key(image)
    (planted / "bin").mkdir(parents=True)
    ran = tmp_path / "ran"
    python = planted / "bin" / "python"
    python.write_text(f"#!/bin/sh\ntouch {ran}\n")
    python.chmod(0o755)
    (planted / READY_MARKER).write_text("{}")
    cache.chmod(0o777)
    with pytest.raises(UntrustedStateError):
        ensure_venv(image, cache, log)
    assert not ran.exists()


def test_a_venv_folder_of_another_user_is_not_trusted(tmp_path):
    _as_root()
    image = ImageSettings(requirements=["tomli-w==1.0.0"])
    cache = private_dir(tmp_path / "venvs")
    planted = cache / venv_key(image)
    (planted / "bin").mkdir(parents=True)
    (planted / READY_MARKER).write_text("{}")
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(UntrustedStateError, match=f"belongs to uid {OTHER_UID}"):
        ensure_venv(image, cache, log)


def _loads_from(archive, module: str = "airflow_gpu_runtime.protocol") -> str:
    """The file ``module`` is loaded from, with ``archive`` first on the path (a fresh Python)."""
    import subprocess
    import sys

    code = f"import sys; sys.path.insert(0, {str(archive)!r}); import {module} as m; print(m.__file__)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_the_local_runtime_archive_is_compiled_once_and_rewritten_when_its_sources_differ(tmp_path):
    """Its modules load compiled; a compiled file of another Python is passed over; other sources are rewritten."""
    import zipfile

    from airflow_gpu_provider.host.state import runtime_file
    from airflow_gpu_provider.task.runtime_zip import entries

    path = runtime_file(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes().startswith(entries())
    assert _loads_from(path).endswith("airflow_gpu_runtime/protocol.pyc")
    written = path.stat().st_mtime_ns
    assert runtime_file(tmp_path) == path and path.stat().st_mtime_ns == written  # reused as it is

    other = tmp_path / "other-python.pyz"  # the same archive, its compiled protocol made by another Python
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(other, "w") as copy:
        for info in source.infolist():
            data = source.read(info)
            copy.writestr(info, b"\0\0\r\n" + data[4:] if info.filename.endswith("protocol.pyc") else data)
    assert _loads_from(other).endswith("airflow_gpu_runtime/protocol.py")

    path.write_bytes(b"PK" + path.read_bytes()[2:100])  # torn, or another runtime's
    assert runtime_file(tmp_path) == path and path.read_bytes().startswith(entries())
    assert _loads_from(path).endswith("protocol.pyc")


def test_the_default_state_dir_is_one_no_other_local_user_can_make_first(monkeypatch):
    """Low item of issue 27: the default lay in sticky /var/tmp, where another user could make it first (the
    provider then refused it, rightly, and every GPU task of the worker stopped). It now lies in the worker user's
    home (its passwd entry, not $HOME), which only root and that user may write to."""
    import pwd
    from pathlib import Path

    from airflow_gpu_provider import config

    monkeypatch.delenv("AIRFLOW__GPU__STATE_DIR")
    monkeypatch.setenv("HOME", "/tmp")  # not the environment's idea of home: two workers must find the same dir
    default = Path(config.get("state_dir"))
    assert default.is_relative_to(pwd.getpwuid(os.geteuid()).pw_dir), default
    for folder in (folder for folder in default.parents if folder.exists()):
        info = folder.stat()
        assert info.st_uid in (0, os.geteuid()) and not info.st_mode & 0o022, f"{folder} is writable by others"
