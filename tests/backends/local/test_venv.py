"""Cached virtualenvs, built for real with uv and pip from the package index."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from airflow_gpu_provider.backends.local.venv import READY_MARKER, ensure_venv
from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.settings import ImageSettings

log = logging.getLogger("test")
SMALL = "tomli-w==1.0.0"


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return Path(out.strip())


def test_uv_venv_holds_only_what_the_worker_lacks_and_is_reused(tmp_path, caplog):
    image = ImageSettings(requirements=[SMALL, "packaging>=20"])
    with caplog.at_level(logging.INFO):
        python = ensure_venv(image, tmp_path, log)
    assert "Built virtualenv" in caplog.text
    assert list(tmp_path.glob("*.lock")) == []  # lock files do not pile up
    assert "deprecated" not in caplog.text  # uv >= 0.11 is told UV_SYSTEM_CERTS, not the old UV_NATIVE_TLS
    names = {p.name.split("-")[0].lower() for p in site_packages(python).glob("*.dist-info")}
    assert "tomli_w" in names
    assert "packaging" not in names  # already in the worker environment: not installed twice
    probe = "import tomli_w, packaging, airflow_gpu_provider; print(tomli_w.dumps({'a': 1}).strip())"
    assert (
        subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout.strip() == "a = 1"
    )

    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert ensure_venv(image, tmp_path, log) == python
    assert "Using cached virtualenv" in caplog.text
    assert "Built virtualenv" not in caplog.text


def _build(cache_dir: str, queue) -> None:
    logging.basicConfig(level=logging.INFO)
    records = []

    class Capture(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("concurrent")
    logger.addHandler(Capture())
    logger.setLevel(logging.INFO)
    python = ensure_venv(ImageSettings(requirements=[SMALL]), cache_dir, logger)
    queue.put((str(python), any(r.startswith("Built virtualenv") for r in records)))


def test_concurrent_tasks_build_the_venv_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_build, args=(str(tmp_path), queue)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    assert len({python for python, _ in results}) == 1
    assert sum(built for _, built in results) == 1


def test_pip_installer(tmp_path):
    python = ensure_venv(ImageSettings(requirements=[SMALL], python_package_installer="pip"), tmp_path, log)
    subprocess.run([str(python), "-c", "import tomli_w, airflow_gpu_provider"], check=True)


def test_failed_install_is_a_clear_error_and_leaves_nothing(tmp_path):
    image = ImageSettings(requirements=["this-package-does-not-exist-airflow-gpu==0.0.1"])
    with pytest.raises(GpuTaskError, match="failed with exit status"):
        ensure_venv(image, tmp_path, log)
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []


def test_interrupted_build_is_rebuilt(tmp_path):
    image = ImageSettings(requirements=[SMALL])
    python = ensure_venv(image, tmp_path, log)
    (python.parent.parent / READY_MARKER).unlink()  # as if the build had been killed before completing
    assert ensure_venv(image, tmp_path, log) == python
    assert (python.parent.parent / READY_MARKER).exists()


def _command_lines() -> str:
    """Every process's command line on this host, as another user could read them in /proc."""
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return "\n".join(lines)


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_credentials_in_the_index_url_never_reach_a_log_or_a_command_line(tmp_path, caplog, installer):
    from backends.docker.docker_fixtures import make_wheel
    from private_index import private_index

    make_wheel(tmp_path / "wheels", "airflow_gpu_private", "1.0", "SECRET_PACKAGE = True\n")
    seen: list[str] = []
    with private_index(tmp_path / "wheels") as index:
        image = ImageSettings(
            requirements=["airflow-gpu-private==1.0"], index_url=index.url(), python_package_installer=installer
        )
        done = threading.Event()

        def watch() -> None:  # what a local user sees while the installers run
            while not done.is_set():
                seen.append(_command_lines())

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            with caplog.at_level(logging.INFO):
                python = ensure_venv(image, tmp_path / "venvs", log)
        finally:
            done.set()
            watcher.join()
        assert index.authorized  # the installer authenticated (from the netrc file)
    subprocess.run([str(python), "-c", "import airflow_gpu_private"], check=True)
    assert index.password not in caplog.text
    assert f"--index-url http://127.0.0.1:{index.port}/simple" in caplog.text  # the URL, without its credentials
    assert seen and not any(index.password in lines for lines in seen)


def test_an_interrupted_install_leaves_no_installer_running(tmp_path):
    """The installer runs from the runtime's archive in its own process group: a task interrupted while it runs (a
    timeout, on_kill) takes it, and the installers it started, along, at once."""

    class Interrupted(Exception):
        pass

    class Log:
        def info(self, message, *args):
            if "pip install --dry-run" in message % args:  # uv now waits for an index that never answers
                raise Interrupted

        warning = info

    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        index = f"http://127.0.0.1:{silent.getsockname()[1]}/simple"
        started = time.monotonic()
        with pytest.raises(Interrupted):
            ensure_venv(ImageSettings(requirements=[SMALL], index_url=index), tmp_path / "venvs", Log())
        assert time.monotonic() - started < 20  # not uv's own timeout
        assert index not in _command_lines()  # neither the runtime's installer nor uv is left running
    assert list((tmp_path / "venvs").iterdir()) == []  # the half-built venv is gone too


def test_the_venv_cache_stays_within_cache_size_least_recently_used_first_never_one_in_use(tmp_path, caplog):
    """Hygiene (issue 27): cached venvs did not stop growing. One byte of cache_size: every venv over it goes but
    the one just built and the one a task still uses."""
    from airflow_gpu_provider.backends.local.venv import venv_key
    from airflow_gpu_provider.host import caches

    first, second, third = (ImageSettings(requirements=[SMALL, extra]) for extra in ("six", "packaging>=20", "idna"))
    one = ensure_venv(first, tmp_path, log, cache_size=1)
    with caches.using(tmp_path, venv_key(first)):  # a task of the first venv still runs
        two = ensure_venv(second, tmp_path, log, cache_size=1)
        assert one.exists() and two.exists()  # in use, and just built
    with caplog.at_level(logging.INFO):
        three = ensure_venv(third, tmp_path, log, cache_size=1)
    removed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Removed cached virtualenv")]
    assert [line.split()[3] for line in removed] == [venv_key(first), venv_key(second)]  # least recently used first
    assert not one.exists() and not two.exists() and three.exists()
    assert "[gpu] cache_size=1 B" in removed[0]
    assert ensure_venv(first, tmp_path, log) == one and one.exists()  # wanted again: built again
