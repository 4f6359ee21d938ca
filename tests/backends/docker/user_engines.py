"""Engines of the worker's own user: a rootless Docker engine and Podman's Docker-compatible API, for real.

On such an engine the container's root is the user who runs the engine, and that user must be the worker's: the
task's files and its checkpoint folder are the worker's own. So these tests run the worker as the engine's user:

- run as a user other than root (a newcomer), the fixtures start the engines as that user and the tests run here;
- run as root (CI), the fixtures start them as :data:`ENGINE_USER` (a system user made when missing, with
  subordinate ids for its user namespace), and every test that asks ``docker_engine`` for ``rootless`` or
  ``podman`` runs in ONE pytest session of that user per engine (``engine_user_session.py``), whose outcome is the
  item's here.

Each engine gets a folder of its own (data, runtime dir, socket; never the host's ``/run/docker.sock``), the base
image (``docker save | docker load``), and is stopped with whatever it started (containers, Podman's pause
process), its folder removed, on every path. Without user namespaces, subordinate ids, ``rootlesskit``,
``slirp4netns``, ``newuidmap`` or ``podman`` the tests skip saying which (fail under ``AIRFLOW_GPU_REQUIRE_DOCKER=1``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE, _unavailable

ENGINE_USER = os.environ.get("AIRFLOW_GPU_ENGINE_USER", "agpu-rootless")
KINDS = ("rootless", "podman")
INNER = "AIRFLOW_GPU_USER_ENGINE"  # set in the engine user's session: KIND=URL of the engine it runs on
ROOTLESS_SCRIPT = ("dockerd-rootless.sh", "/usr/share/docker.io/contrib/dockerd-rootless.sh")
SUBIDS = 65536


@dataclasses.dataclass
class UserEngine:
    """An engine of the worker's own user: its kind, URL, a docker-py client, its folder and its user."""

    kind: str
    url: str
    client: Any
    root: Path | None = None  # None: started by another session (the engine user's, given the URL)
    user: str = ""
    outcomes: dict[str, dict[str, Any]] | None = None  # the engine user's session's, by node id


def _script() -> str | None:
    """``dockerd-rootless.sh``: on the PATH, or where Debian's docker.io puts it."""
    return shutil.which(ROOTLESS_SCRIPT[0]) or (ROOTLESS_SCRIPT[1] if os.path.isfile(ROOTLESS_SCRIPT[1]) else None)


def why_not(kind: str) -> str | None:
    """Why an engine of this kind cannot run here (what is missing), or ``None``."""
    tools = ["rootlesskit", "slirp4netns", "newuidmap", "newgidmap", "docker"]
    tools += ["podman"] if kind == "podman" else ["dockerd"]
    needs = [
        f"{tool} (apt-get install {'uidmap' if 'map' in tool else tool})" for tool in tools if not shutil.which(tool)
    ]
    if kind == "rootless" and _script() is None:
        needs.append("dockerd-rootless.sh (Debian's docker.io ships it in /usr/share/docker.io/contrib)")
    for knob, bad in (("/proc/sys/user/max_user_namespaces", "0"), ("/proc/sys/kernel/unprivileged_userns_clone", "0")):
        with contextlib.suppress(OSError):
            if Path(knob).read_text().strip() == bad:
                needs.append(f"user namespaces ({knob} is {bad}: sysctl -w {knob[10:].replace('/', '.')}=1)")
    if os.geteuid() != 0 and not _ranges(pwd.getpwuid(os.geteuid()).pw_name):
        needs.append("subordinate ids for your user in /etc/subuid and /etc/subgid (usermod --add-subuids ...)")
    return f"a {kind} engine of the worker's own user needs {', '.join(needs)}" if needs else None


def _ranges(user: str) -> bool:
    found = []
    for table in ("/etc/subuid", "/etc/subgid"):
        with contextlib.suppress(OSError):
            found.append(any(line.split(":")[0] == user for line in Path(table).read_text().splitlines()))
    return len(found) == 2 and all(found)


def engine_user() -> pwd.struct_passwd:
    """The engine's (and the worker's) user: this one, or, for root, :data:`ENGINE_USER`, made when missing."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    try:
        entry = pwd.getpwnam(ENGINE_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--shell", "/usr/sbin/nologin", "--home-dir", "/nonexistent",
                        "--no-create-home", ENGINE_USER], check=True, capture_output=True)  # fmt: skip
        entry = pwd.getpwnam(ENGINE_USER)
    if not _ranges(ENGINE_USER):  # a free range above every range already given out
        ends = [int(start) + int(count) for table in ("/etc/subuid", "/etc/subgid") if os.path.exists(table)
                for line in Path(table).read_text().splitlines() if line.count(":") == 2
                for _, start, count in [line.split(":")]]  # fmt: skip
        first = max([200000, *ends])
        span = f"{first}-{first + SUBIDS - 1}"
        subprocess.run(["usermod", "--add-subuids", span, "--add-subgids", span, ENGINE_USER], check=True)
    return entry


def _as_user(entry: pwd.struct_passwd, command: list[str], env: dict[str, str]) -> list[str]:
    """``command`` run as ``entry`` with only ``env`` (``runuser`` when this process is root)."""
    variables = [f"{key}={value}" for key, value in env.items()]
    base = ["env", "-i", *variables, *command]
    return ["runuser", "-u", entry.pw_name, "--", *base] if os.geteuid() == 0 else base


def _folder(entry: pwd.struct_passwd) -> Path:
    root = Path(tempfile.mkdtemp(prefix="agpu-ue-"))  # short: a unix socket path is at most 107 bytes
    root.chmod(0o755)
    for name, mode in (("home", 0o700), ("run", 0o700)):
        (root / name).mkdir(mode=mode)
        if os.geteuid() == 0:
            os.chown(root / name, entry.pw_uid, entry.pw_gid)
    return root


def _start(kind: str, entry: pwd.struct_passwd, root: Path) -> subprocess.Popen[bytes]:
    home, run = root / "home", root / "run"
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home),
           "XDG_RUNTIME_DIR": str(run), "XDG_CONFIG_HOME": f"{home}/.config", "XDG_DATA_HOME": f"{home}/.local/share"}  # fmt: skip
    if kind == "rootless":
        command = ["sh", str(_script()), "--data-root", f"{home}/data", "--exec-root", f"{run}/exec", "--pidfile",
                   f"{run}/dockerd.pid", "-H", f"unix://{run}/engine.sock", "--config-file", f"{root}/daemon.json",
                   "--shutdown-timeout", "2"]  # fmt: skip
        (root / "daemon.json").write_text("{}")
    else:
        command = ["podman", "--root", f"{home}/storage", "--runroot", f"{run}/storage", "--storage-driver", "overlay",
                   "--cgroup-manager", "cgroupfs", "--events-backend", "file", "system", "service", "--time", "0",
                   f"unix://{run}/engine.sock"]  # fmt: skip
    with open(root / "engine.log", "wb") as log:
        return subprocess.Popen(_as_user(entry, command, env), cwd=root, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def _wait(url: str, process: subprocess.Popen[bytes], log: Path) -> Any:
    import docker

    deadline = time.monotonic() + 90
    while True:
        with contextlib.suppress(Exception):
            client = docker.APIClient(base_url=url, version="1.41", timeout=120)
            client.ping()
            return client
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the engine did not start (exit {process.poll()}):\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def _stop(kind: str, process: subprocess.Popen[bytes] | None, client: Any, root: Path) -> None:
    """Stop what this fixture started: the containers (Podman leaves them running), the engine, Podman's pause."""
    if client is not None:
        with contextlib.suppress(Exception):
            for container in client.containers(all=True):
                with contextlib.suppress(Exception):
                    client.kill(container["Id"])  # (Podman's forced removal waits 10 s for a stop)
                client.remove_container(container["Id"], force=True)
    if process is not None and process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    for pidfile in ("run/libpod/tmp/pause.pid", "run/exec/containerd/containerd.pid", "run/dockerd.pid"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((root / pidfile).read_text().strip()), signal.SIGKILL)  # its own, if still there
    if os.geteuid() == 0:
        shutil.rmtree(root, ignore_errors=True)
    else:  # the data root holds files of the subordinate ids: removed from inside a user namespace
        subprocess.run(["rootlesskit", "--net=host", "rm", "-rf", str(root)], capture_output=True, timeout=120)


def _load_base_image(url: str) -> None:
    save = subprocess.Popen(["docker", "save", BASE_IMAGE], stdout=subprocess.PIPE)  # from the session's engine
    loaded = subprocess.run(["docker", "-H", url, "load", "-q"], stdin=save.stdout, capture_output=True, timeout=300)
    assert save.wait(timeout=60) == 0 and loaded.returncode == 0, loaded.stderr.decode()[-2000:]


@contextlib.contextmanager
def user_engine(kind: str) -> Iterator[UserEngine]:
    """The engine of this kind: the one this session was given (the engine user's session), or a fresh one."""
    import docker

    given = os.environ.get(INNER, "")
    if given.startswith(f"{kind}="):
        url = given.split("=", 1)[1]
        yield UserEngine(kind, url, docker.APIClient(base_url=url, version="auto", timeout=120))
        return
    problem = why_not(kind)
    if problem:
        _unavailable(problem)
    entry = engine_user()
    root = _folder(entry)
    process = client = None
    try:
        process = _start(kind, entry, root)
        url = f"unix://{root}/run/engine.sock"
        client = _wait(url, process, root / "engine.log")
        _load_base_image(url)
        yield UserEngine(kind, url, client, root, entry.pw_name)
    finally:
        _stop(kind, process, client, root)


@pytest.fixture(scope="session")
def rootless_engine(docker_client: Any) -> Iterator[UserEngine]:
    """A rootless Docker engine (``dockerd-rootless.sh``) of the worker's own user, the base image loaded."""
    with user_engine("rootless") as engine:
        yield engine


@pytest.fixture(scope="session")
def podman_engine(docker_client: Any) -> Iterator[UserEngine]:
    """Podman's Docker-compatible API (``podman system service``) of the worker's own user, the base image loaded."""
    with user_engine("podman") as engine:
        yield engine


def engines(*names: str) -> pytest.MarkDecorator:
    """Run a test on these engines (``docker_engine``): ``host``, ``authz``, ``rootless``, ``podman``."""
    return pytest.mark.parametrize("docker_engine", names, indirect=True)
