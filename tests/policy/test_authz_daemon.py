"""The authorization plugin's daemon, run as it runs: as root, ``python3 -I -S`` from its install, its policy a file
only root may change, its judge a child with the workers' user's ids and no way back to root (H3 of issue 34).

Its socket is asked as the engine asks it (``/AuthZPlugin.AuthZReq``), through its own health check (``check``).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from backends.docker.authz_engine import install_plugin, policy_file, root_folder
from backends.docker.docker_fixtures import _unavailable

NOBODY = pwd.getpwnam("nobody")
CHECK = [sys.executable, "-m", "airflow_gpu_provider.policy.authz", "check", "--user", "nobody"]


@pytest.fixture
def secure() -> Iterator[Path]:
    """A folder only root may write, with the plugin installed and this session's policy in it."""
    if os.geteuid() != 0:
        _unavailable("the authorization plugin's daemon runs as root (CI runs the suite as root)")
    folder = root_folder()
    try:
        install_plugin(folder)
        policy_file(folder / "policy.cfg")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def serve(folder: Path, *extra: str, env: dict | None = None, isolated: bool = True,
          policy: Path | None = None) -> subprocess.Popen[str]:  # fmt: skip
    flags = ["-I", "-S"] if isolated else []
    return subprocess.Popen(
        [sys.executable, *flags, str(folder / "airflow-gpu-docker-authz.pyz"), "serve", "--socket",
         str(folder / "plugin.sock"), "--policy", str(policy or folder / "policy.cfg"), "--user", "nobody", *extra],
        stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )  # fmt: skip


def started(daemon: subprocess.Popen[str], folder: Path) -> None:
    deadline = time.monotonic() + 60
    while not (folder / "plugin.sock").exists():
        assert daemon.poll() is None and time.monotonic() < deadline, daemon.communicate(timeout=10)[1]
        time.sleep(0.05)


def stop(daemon: subprocess.Popen[str]) -> str:
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
    return daemon.communicate(timeout=30)[1]


def judges(daemon: subprocess.Popen[str]) -> list[int]:
    children = Path(f"/proc/{daemon.pid}/task/{daemon.pid}/children").read_text().split()
    return [int(pid) for pid in children]


def check(folder: Path) -> subprocess.CompletedProcess[str]:
    command = [*CHECK, "--policy", str(folder / "policy.cfg"), "--socket", str(folder / "plugin.sock")]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_h3_the_daemon_never_imports_airflow_and_its_judge_has_no_way_back_to_root(secure, tmp_path):
    """Code the workers' user planted where Airflow would run it (``airflow_local_settings.py``, a package on
    ``PYTHONPATH``), and a writable ``airflow.cfg`` allowing ``/``, change nothing: the daemon reads its own file."""
    home = tmp_path / "airflow"
    (home / "config").mkdir(parents=True)
    planted = "import pathlib; pathlib.Path({!r}).write_text('ran')\n"
    (home / "config" / "airflow_local_settings.py").write_text(planted.format(str(tmp_path / "local-settings-ran")))
    (tmp_path / "site" / "airflow").mkdir(parents=True)
    (tmp_path / "site" / "airflow" / "__init__.py").write_text(planted.format(str(tmp_path / "airflow-imported")))
    (home / "airflow.cfg").write_text("[gpu_policy]\nallowed_mount_roots = /srv:rw\n[gpu]\nallowed_mount_roots = /\n")
    env = {**os.environ, "AIRFLOW_HOME": str(home), "PYTHONPATH": str(tmp_path / "site"),
           "AIRFLOW__GPU_POLICY__ALLOWED_MOUNT_ROOTS": "/:rw"}  # fmt: skip
    daemon = serve(secure, env=env)
    try:
        started(daemon, secure)
        done = check(secure)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "allowed_mount_roots = \n" in done.stdout  # its file's (empty), none of the planted ones
        [judge] = judges(daemon)
        status = Path(f"/proc/{judge}/status").read_text()
        ids = f"{NOBODY.pw_uid}\t{NOBODY.pw_uid}\t{NOBODY.pw_uid}\t{NOBODY.pw_uid}"
        assert f"Uid:\t{ids}" in status and f"Gid:\t{ids.replace(str(NOBODY.pw_uid), str(NOBODY.pw_gid))}" in status
        assert os.stat(f"/proc/{judge}/environ").st_uid == 0  # not dumpable: nobody may trace it or read its memory
        assert Path(f"/proc/{daemon.pid}/status").read_text().count("Uid:\t0\t0\t0\t0") == 1  # the daemon: root
    finally:
        log = stop(daemon)
    assert not (tmp_path / "local-settings-ran").exists() and not (tmp_path / "airflow-imported").exists()
    assert daemon.returncode == 0 and not (secure / "plugin.sock").exists(), log


def test_a_stopped_judge_is_a_refusal_within_its_timeout_and_a_new_judge_takes_over(secure):
    daemon = serve(secure, "--timeout", "1")
    try:
        started(daemon, secure)
        [judge] = judges(daemon)
        os.kill(judge, signal.SIGSTOP)  # as the workers' user may: the judge runs as that user
        began = time.monotonic()
        done = check(secure)
        assert done.returncode == 1 and "gave no verdict in time" in done.stdout, done.stdout
        assert time.monotonic() - began < 10
        assert judges(daemon) != [judge]
        again = check(secure)
        assert again.returncode == 0, again.stdout
    finally:
        log = stop(daemon)
    assert "refused, and a new judge is forked" in log


@pytest.mark.parametrize("problem", ["writable by others", "in /tmp", "a link", "names a variable", "no deployment"])
def test_a_policy_file_root_alone_cannot_vouch_for_is_refused(secure, tmp_path, problem):
    policy = secure / "policy.cfg"
    if problem == "writable by others":
        policy.chmod(0o666)
    elif problem == "in /tmp":  # /tmp is everyone's: another user could have made the folder or the file first
        policy = Path(shutil.copy(policy, tmp_path / "policy.cfg"))
    elif problem == "a link":
        policy.rename(secure / "real.cfg")
        policy.symlink_to(secure / "real.cfg")
    elif problem == "names a variable":
        policy.write_text(policy.read_text().replace("allowed_volumes = ", "allowed_volumes = $VOLUMES"))
    else:
        policy.write_text(policy.read_text().replace("deployment = ", "deployment_was = "))
    daemon = serve(secure, policy=policy)
    log = stop(daemon) if daemon.wait(timeout=60) is not None else ""
    assert daemon.returncode != 0 and not (secure / "plugin.sock").exists(), log
    words = {
        "writable by others": "writable by its group or others",
        "in /tmp": "writable by its group or others",
        "a link": "symbolic link",
        "names a variable": "names a variable",
        "no deployment": "deployment is required",
    }
    assert words[problem] in log, log  # fmt: skip


def test_as_root_it_runs_only_isolated_and_from_a_root_install(secure, tmp_path):
    not_isolated = serve(secure, isolated=False)
    assert not_isolated.wait(timeout=60) != 0 and "python3 -I -S" in stop(not_isolated)
    shutil.copy(secure / "airflow-gpu-docker-authz.pyz", tmp_path / "airflow-gpu-docker-authz.pyz")
    (tmp_path / "policy.cfg").symlink_to(secure / "policy.cfg")
    elsewhere = serve(tmp_path)  # an install in /tmp: another user could have replaced it
    assert elsewhere.wait(timeout=60) != 0 and "writable by its group or others" in stop(elsewhere)


IMPORTS = """import json, sys
sys.path.insert(0, sys.argv[1])
import airflow_gpu_provider.policy.authz.__main__, airflow_gpu_provider.policy.authz.server
import airflow_gpu_provider.policy.authz.install
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] in ("airflow", "docker", "requests"))))
"""


def test_the_install_is_the_same_bytes_every_time_and_holds_all_it_imports(secure):
    from airflow_gpu_provider.policy.authz.install import build

    archive = secure / "airflow-gpu-docker-authz.pyz"
    assert archive.read_bytes() == build() and oct(archive.stat().st_mode & 0o7777) == "0o644"
    done = subprocess.run([sys.executable, "-I", "-S", "-c", IMPORTS, str(archive)], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0 and json.loads(done.stdout) == [], done.stderr
