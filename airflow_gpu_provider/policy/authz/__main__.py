"""``airflow-gpu-docker-authz --socket PATH --user USER``: the Docker engine's authorization plugin.

Started as root before the engine (docs/docker.md: the systemd unit and ``daemon.json``), it makes its socket
(``/run/docker/plugins/airflow-gpu.sock``: the engine then knows the plugin as ``airflow-gpu``), then judges as the
worker's user: its effective uid, gid and groups become the worker's (``--user``), so that "the worker's own user"
(rule D2) and the folders the worker may trust (rule F1) mean what they mean on the worker. Its real uid stays
root's, so the worker's processes (and DAG authors' code in them) can neither signal nor trace it. It reads the
``[gpu]`` section as the worker does (Airflow's configuration: ``AIRFLOW_HOME`` or ``AIRFLOW_CONFIG``, and
``AIRFLOW__GPU__*`` variables), once: restart it after changing the section.
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import logging
import os
import pwd
import signal
import sys
import threading

from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.authz.server import AuthzServer, engine_containers

log = logging.getLogger("airflow_gpu_provider.authz")


def identity(user: str) -> tuple[int, int, list[int]]:
    """``(uid, gid, groups)`` of ``name``, ``uid`` or ``uid:gid`` (a name's groups from the host's group database)."""
    name, _, group = user.partition(":")
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        if not name.isdigit():
            raise SystemExit(f"--user {user!r}: no such user on this host") from None
        uid, gid = int(name), int(group or name)
        return uid, gid, [gid]
    gid = int(group) if group.isdigit() else (grp.getgrnam(group).gr_gid if group else entry.pw_gid)
    return entry.pw_uid, gid, os.getgrouplist(entry.pw_name, gid)


def judge_as(user: str | None) -> None:
    """Take the worker's effective identity (real uid root kept: see the module's docstring)."""
    if os.geteuid() != 0:
        if user is not None and identity(user)[:2] != (os.geteuid(), os.getegid()):
            raise SystemExit(f"--user {user!r}: only root may judge as another user")
        log.warning("Running as uid %d: this user's processes can replace the plugin; start it as root", os.geteuid())
        return
    if user is None:
        raise SystemExit("started as root: --user must name the user Airflow's workers run as (name, uid or uid:gid)")
    uid, gid, groups = identity(user)
    os.setgroups(groups)
    os.setegid(gid)
    os.seteuid(uid)


def main(argv: list[str] | None = None) -> int:
    """Serve the plugin until SIGTERM or SIGINT; the socket is removed on the way out."""
    parser = argparse.ArgumentParser(prog="airflow-gpu-docker-authz", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="where to listen: /run/docker/plugins/NAME.sock")
    parser.add_argument("--user", help="the user Airflow's workers run as (name, uid or uid:gid); required as root")
    parser.add_argument("--engine", default="/var/run/docker.sock", help="the engine's socket (default: %(default)s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    server = AuthzServer(args.socket)
    root = os.geteuid() == 0
    try:
        judge_as(args.user)
        server.policy = Policy.current()  # Airflow's configuration, read as the worker
        server.containers = engine_containers(args.engine.removeprefix("unix://"))
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: threading.Thread(target=server.shutdown).start())
        log.info("airflow-gpu-docker-authz on %s, judging as uid %d gid %d", args.socket, os.geteuid(), os.getegid())
        server.serve_forever()
    finally:
        server.server_close()
        if root:
            os.seteuid(0)  # the socket lies in a folder of root's
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.socket)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
