"""Cached virtualenvs for injected requirements on the local backend.

A venv holds only what the worker's own environment lacks; the worker's packages (torch, ...) stay visible through
a ``.pth`` file, so a requirement like ``accelerate`` never drags a second multi-GB torch download in. The install
is the runtime's installer, run from its archive (``python runtime.pyz install ...``, output streamed to the task
log), the same one Kubernetes init containers run: uv resolves against the worker environment and installs the
missing pins; pip sees the worker's packages through the ``.pth`` file by itself. Index credentials reach it in a
private netrc file (``NETRC``), never on its command line.

Venvs are keyed by the image's requirements hash plus the worker environment, created under a per-key ``flock``
(concurrent tasks build once) and marked ready only when complete (a crash mid-build is rebuilt). The cache stays
within ``[gpu] cache_size``: after a build, the least recently used venvs go, never one a task uses
(:mod:`~airflow_gpu_provider.host.caches`; the local backend holds its venv's use file while the task runs).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.host import caches
from airflow_gpu_provider.host.state import check_owned, exclusive, open_private, private_dir, runtime_file
from airflow_gpu_provider.runtime.protocol import INSTALL, PREFIX, InstallError, split_credentials
from airflow_gpu_provider.settings import ImageSettings

READY_MARKER = ".airflow-gpu-ready"


def _worker_site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def venv_key(image: ImageSettings) -> str:
    """Cache key: requirements + installer options + this worker's interpreter and installed packages."""
    worker = {
        "python": sys.version,
        "prefix": sys.prefix,
        "site": {d: os.stat(d).st_mtime_ns for d in _worker_site_dirs() if os.path.isdir(d)},
    }
    blob = json.dumps({"image": image.install_options, "worker": worker}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _uv() -> str:
    try:
        from uv import find_uv_bin
    except ImportError:
        found = shutil.which("uv")
        if found is None:
            raise GpuTaskError(
                "python_package_installer='uv' but uv is not installed on the worker; pip install uv, "
                "or use python_package_installer='pip'"
            ) from None
        return found
    return find_uv_bin()


@contextlib.contextmanager
def _netrc(netrc: str) -> Iterator[dict[str, str]]:
    """The installer's environment; with index credentials, ``NETRC`` names a private file that holds them.

    The file (0600 in a 0700 folder) lives for the install's time only.
    """
    if not netrc:
        yield dict(os.environ)
        return
    folder = tempfile.mkdtemp(prefix="airflow-gpu-netrc-")  # 0700
    try:
        path = os.path.join(folder, "netrc")
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
            handle.write(netrc)
        yield {**os.environ, "NETRC": path}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _install(image: ImageSettings, python: Path, uv: str | None, runtime: Path, log: logging.Logger) -> None:
    """``python runtime.pyz install``: what the worker lacks, into the venv of ``python``; its output to the log.

    :raises InstallError: when the installer fails (its message ends with the installer's last lines)
    """
    index_args, netrc = split_credentials(image.installer_index_args())
    argv = [
        sys.executable, str(runtime), INSTALL, "--python", str(python), "--resolve-with", sys.executable,
        "--where", "the worker environment", *(["--uv", uv] if uv else []),
        "-", image.python_package_installer, *index_args, "--", *image.requirements,
    ]  # fmt: skip
    with _netrc(netrc) as environ:
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ, start_new_session=True
        )
        assert process.stdout is not None and process.stderr is not None
        errors: list[str] = []
        drain = threading.Thread(target=errors.extend, args=(process.stderr,), daemon=True)
        drain.start()
        try:
            for line in process.stdout:
                log.info("%s", line.rstrip().removeprefix(f"{PREFIX} "))
        except BaseException:  # the task was interrupted: its installers go with it (their own process group)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            raise
        finally:
            status = process.wait()
            drain.join()
    if status != 0:
        raise InstallError("".join(errors).strip().removeprefix(f"{PREFIX} ") or f"exit status {status}")


def _create(path: Path, image: ImageSettings, runtime: Path, log: logging.Logger) -> None:
    """A venv that sees the worker's packages (a ``.pth`` file), with what the worker lacks installed into it."""
    emit = functools.partial(log.info, "%s")
    uv = _uv() if image.python_package_installer == "uv" else None
    try:
        if uv is not None:
            emit(f"$ {uv} venv {path}")
            subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(path)], check=True)
        else:
            emit(f"$ {sys.executable} -m venv {path}")
            subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        python = path / "bin" / "python"
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        Path(purelib, "_airflow_gpu_worker_site.pth").write_text("\n".join(_worker_site_dirs()) + "\n")
        _install(image, python, uv, runtime, log)  # what the worker itself lacks
    except (InstallError, subprocess.CalledProcessError) as err:
        raise GpuTaskError(f"Building the virtualenv for the requirements failed: {err}") from None


def _ready(path: Path) -> bool:
    """Whether ``path`` is a complete venv that this worker built (its own folder and marker; never another's)."""
    try:
        check_owned(path, os.lstat(path), directory=True)
        os.close(open_private(path / READY_MARKER, os.O_RDONLY))
    except FileNotFoundError:
        return False
    return True


def ensure_venv(
    image: ImageSettings,
    cache_dir: str | os.PathLike[str],
    log: logging.Logger,
    *,
    runtime: Path | None = None,
    cache_size: int = 0,
) -> Path:
    """Return the Python of a ready venv for ``image``'s requirements, creating it once per key.

    :param runtime: the runtime's archive (default: written into the state dir that holds ``cache_dir``)
    :param cache_size: bytes the venvs of ``cache_dir`` may take (``[gpu] cache_size``; 0: no limit)
    :raises UntrustedStateError: when the cache folder, the venv or its marker is not the worker's own
    """
    root = private_dir(cache_dir)
    with venv_in_use(root, image):  # never removed while this task looks it up, builds it or uses it
        python = _ensure(image, root, log, runtime)
        caches.evict(root, _sizes(root), cache_size, _remover(root), what="cached virtualenv", log=log)
        return python


def venv_in_use(cache_dir: str | os.PathLike[str], image: ImageSettings) -> contextlib.AbstractContextManager[int]:
    """Hold the venv of ``image`` as in use (:func:`.host.caches.using`); a failed build leaves no use file."""
    root, key = Path(cache_dir), venv_key(image)
    return caches.using(root, key, exists=(root / key).is_dir)


def _ensure(image: ImageSettings, root: Path, log: logging.Logger, runtime: Path | None) -> Path:
    key = venv_key(image)
    path = root / key
    python = path / "bin" / "python"
    if _ready(path):
        log.info("Using cached virtualenv %s (requirements %s)", path, image.requirements_hash)
        return python
    started = time.monotonic()
    with exclusive(root / f"{key}.lock") as waited:  # concurrent tasks wait here for the one that builds
        if _ready(path):
            log.info("Using virtualenv %s, built by another task while this one waited %.1fs", path, waited)
            return python
        if path.exists():
            log.warning("Removing incomplete virtualenv %s left by an interrupted build", path)
            shutil.rmtree(path)
        try:
            _create(path, image, runtime or runtime_file(root.parent), log)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        marker = {"requirements": list(image.requirements), "installer": image.python_package_installer}
        (path / READY_MARKER).write_text(json.dumps({**marker, "created": time.time(), "size": _disk_usage(path)}))
        log.info("Built virtualenv %s in %.1fs", path, time.monotonic() - started)
        return python


def _disk_usage(path: Path) -> int:
    """Bytes a folder takes on disk (its blocks), links not followed."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


def _sizes(root: Path) -> dict[str, int]:
    """Every venv of the cache folder and the bytes it takes (a build under way counts as nothing yet)."""
    sizes = {}
    for entry in root.iterdir():
        if not entry.is_dir() or entry.is_symlink():
            continue
        try:
            marker = json.loads((entry / READY_MARKER).read_text())
        except (OSError, ValueError):
            sizes[entry.name] = 0
            continue
        if not isinstance(marker.get("size"), int):  # built by an older release: measured once
            marker["size"] = _disk_usage(entry)
            (entry / READY_MARKER).write_text(json.dumps(marker))
        sizes[entry.name] = marker["size"]
    return sizes


def _remover(root: Path) -> Callable[[str], bool]:
    def remove(key: str) -> bool:
        shutil.rmtree(root / key, ignore_errors=True)
        return True

    return remove
