"""A second Docker engine of the tests' own, with the provider's authorization plugin: the engine enforces the policy.

``authz_engine`` (session-scoped, started when a test first asks for it) installs the plugin's zip archive and its
policy file (the session's ``[gpu_policy]`` and ``[gpu] state_dir``, plus pytest's temporary root as an allowed
checkpoint root, so that the checkpoint tests' ``tmp_path`` roots are the plugin's too) into a folder only root may
write, starts it as it runs in production (as root, ``python3 -I -S`` from its install), then ``dockerd`` with a data
root, exec root, pid file and socket of its own, in network and mount namespaces of its own (``unshare --net
--mount``):

- its own network namespace, with ``--bridge=none --iptables=false``: run in the host's namespace, ``--bridge=none``
  deletes the host's ``docker0`` and every container of the first engine then fails to start;
- its own mount namespace, with a tmpfs on ``/run``: the engine finds the plugin at ``/run/docker/plugins/
  airflow-gpu.sock`` (bind-mounted from the session's folder) and no other engine's state, and nothing of it is
  written to the host's ``/run``.

The base image is loaded into it before the plugin is turned on (``docker save | docker load``: no call of the
provider's), then ``daemon.json`` names the plugin and the engine reloads it (SIGHUP). ``docker_engine``
parametrises a test over the host's engine and this one (``DOCKER_HOST`` points at it). The engine and the plugin
are stopped, and their folders removed, on every path. Like every Docker test, these skip without what they need
(root, ``unshare``, ``dockerd``), and fail instead under ``AIRFLOW_GPU_REQUIRE_DOCKER=1`` (CI).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE, _unavailable

PLUGIN = "airflow-gpu"
START_TIMEOUT = 60
# The engine's namespace: /run is its own (the plugin's socket only); then the engine, on its own folders.
ENGINE_SCRIPT = (
    'mount -t tmpfs tmpfs /run && mkdir -p /run/docker/plugins && mount --bind "$1" /run/docker/plugins && '
    'exec dockerd --config-file "$2/daemon.json" --data-root "$2/data" --exec-root "$2/exec" '
    '--pidfile "$2/dockerd.pid" -H "unix://$2/docker.sock" --bridge=none --iptables=false --ip-masq=false '
    "--userland-proxy=false --shutdown-timeout=2"
)


#: Volumes the session's plugin lists: one a bind of a host folder in disguise, one plain (made before it is on)
VOLUMES = {"bind": "agpu-authz-bind-volume", "plain": "agpu-authz-plain-volume"}


def policy_file(path: Path, extra_roots: str = "", **overrides: str) -> Path:
    """The session's ``[gpu_policy]`` (and ``[gpu] state_dir``) as a root-owned INI file at ``path``, 0644."""
    from airflow_gpu_provider import config

    values = {**config.policy_values(), **overrides}
    if extra_roots:
        values["allowed_checkpoint_roots"] = ",".join(filter(None, (values["allowed_checkpoint_roots"], extra_roots)))
    lines = ["[gpu_policy]", *(f"{k} = {v}".replace("%", "%%") for k, v in values.items()), "[gpu]",
             f"state_dir = {config.get('state_dir')}"]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o644)
    return path


def install_plugin(folder: Path) -> Path:
    """The plugin's zip archive, installed into ``folder`` (root's alone) as an admin installs it."""
    subprocess.run([sys.executable, "-m", "airflow_gpu_provider.policy.authz", "install", "--prefix", str(folder)],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    return folder / "airflow-gpu-docker-authz.pyz"


def root_folder() -> Path:
    """A new folder only root may write, on a path whose every folder is root's alone (``/run``: not ``/tmp``)."""
    return Path(tempfile.mkdtemp(prefix="agpu-authz-", dir="/run"))


@dataclasses.dataclass
class AuthzEngine:
    """The second engine: its URL, a docker-py client of it, its folder and the plugin's log."""

    url: str
    client: Any
    root: Path
    policy_path: str  # the plugin's policy file
    planted: dict[str, str]  # what was made before the plugin was on: containers' ids, a host folder

    @property
    def plugin_log(self) -> str:
        return (self.root / "plugin.log").read_text(errors="replace")

    @property
    def policy(self) -> Any:
        """The plugin's policy, as it reads it (``Policy``)."""
        from types import SimpleNamespace

        from airflow_gpu_provider.policy import Policy
        from airflow_gpu_provider.policy.authz.settings import load

        return Policy.of(SimpleNamespace(**vars(load(self.policy_path, os.geteuid()))))


def _why_not() -> str | None:
    needs = [tool for tool in ("unshare", "dockerd", "docker") if shutil.which(tool) is None]
    if os.geteuid() != 0:
        needs.append("root (a second dockerd runs as root)")
    return f"a second Docker engine with the authorization plugin needs {', '.join(needs)}" if needs else None


def _wait(check: Any, what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not check():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start (exit {process.poll()}):\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, then SIGKILL to its whole process group after a grace (a process this fixture started)."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


@pytest.fixture(scope="session")
def authz_engine(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthzEngine]:
    """The second engine with the plugin, the base image loaded; stopped and removed at the end of the session."""
    import docker

    problem = _why_not()
    if problem:
        _unavailable(problem)
    root = Path(tempfile.mkdtemp(prefix="agpu-authz-"))  # short: unix socket paths are at most 107 bytes
    secure = root_folder()  # the plugin's install and its policy
    (root / "plugins").mkdir()
    (root / "daemon.json").write_text("{}")  # not the host's /etc/docker/daemon.json
    plugin = engine = None
    try:
        policy = policy_file(secure / "policy.cfg", str(tmp_path_factory.getbasetemp()),
                             allowed_volumes=",".join(VOLUMES.values()))  # fmt: skip
        with open(root / "plugin.log", "wb") as log:
            plugin = subprocess.Popen(
                [sys.executable, "-I", "-S", str(install_plugin(secure)), "serve", "--socket",
                 f"{root}/plugins/{PLUGIN}.sock", "--policy", str(policy), "--user", f"{os.geteuid()}:{os.getegid()}",
                 "--engine", f"{root}/docker.sock"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        _wait(lambda: b"airflow-gpu-docker-authz on" in (root / "plugin.log").read_bytes(), "the plugin", plugin,
              root / "plugin.log")  # fmt: skip
        with open(root / "dockerd.log", "wb") as log:
            engine = subprocess.Popen(
                ["unshare", "--net", "--mount", "--propagation", "private", "--", "sh", "-c", ENGINE_SCRIPT, "sh",
                 f"{root}/plugins", str(root)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        url = f"unix://{root}/docker.sock"

        def answers() -> bool:
            with contextlib.suppress(Exception):
                return bool(docker.APIClient(base_url=url, version="1.41", timeout=5).ping())
            return False

        _wait(answers, "the second engine", engine, root / "dockerd.log")
        client = docker.APIClient(base_url=url, version="auto", timeout=120)
        save = subprocess.Popen(["docker", "save", BASE_IMAGE], stdout=subprocess.PIPE)
        loaded = subprocess.run(
            ["docker", "-H", url, "load", "-q"], stdin=save.stdout, capture_output=True, timeout=300
        )
        assert save.wait(timeout=60) == 0 and loaded.returncode == 0, loaded.stderr.decode()[-2000:]
        planted = _plant(client, root)
        (root / "daemon.json").write_text(json.dumps({"authorization-plugins": [PLUGIN]}))
        os.kill(int((root / "dockerd.pid").read_text()), signal.SIGHUP)  # the engine reloads its plugins

        def guarded() -> bool:
            with contextlib.suppress(docker.errors.APIError):
                client.networks()  # no call of the provider's
                return False
            return True

        _wait(guarded, "the plugin's guard", engine, root / "dockerd.log")
        yield AuthzEngine(url, client, root, str(policy), planted)
    finally:
        _stop(engine)
        _stop(plugin)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(secure, ignore_errors=True)


def _plant(client: Any, root: Path) -> dict[str, str]:
    """What an engine had before its plugin was installed: a privileged root container with a writable host folder,
    labelled as this deployment's (made by hand, or by an older provider), one of no one's, and the listed volumes
    (one a bind of a host folder)."""
    from airflow_gpu_provider.host.workers import deployment
    from airflow_gpu_provider.policy.authz.stored import DEPLOYMENT_LABEL

    folder = root / "host-folder"
    folder.mkdir()
    host = client.create_host_config(privileged=True, binds=[f"{folder}:/host:rw"])
    ours = client.create_container(BASE_IMAGE, ["sleep", "600"], user="0:0", host_config=host,
                                   labels={DEPLOYMENT_LABEL: deployment()})["Id"]  # fmt: skip
    foreign = client.create_container(BASE_IMAGE, ["sleep", "600"])["Id"]
    (root / "volume-host").mkdir()
    client.create_volume(VOLUMES["bind"], driver_opts={"type": "none", "o": "bind", "device": f"{root}/volume-host"})
    client.create_volume(VOLUMES["plain"])
    return {"ours": ours, "foreign": foreign, "folder": str(folder), "volume-host": f"{root}/volume-host"}


@pytest.fixture(params=["host", "authz"])
def docker_engine(request: pytest.FixtureRequest, docker_client: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The engine a test runs on: the host's, or the second one with the plugin (``DOCKER_HOST`` points at it).

    A test may ask for others with ``user_engines.engines(...)``: ``rootless`` and ``podman`` are engines of the worker's own user
    (``user_engines.py``).
    """
    if request.param == "host":
        return docker_client
    if request.param in ("rootless", "podman"):
        engine: Any = request.getfixturevalue(f"{request.param}_engine")
        monkeypatch.setenv("DOCKER_HOST", engine.url)
        return engine.client
    engine = request.getfixturevalue("authz_engine")
    monkeypatch.setenv("DOCKER_HOST", engine.url)
    return engine.client
