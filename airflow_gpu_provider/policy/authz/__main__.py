"""``airflow-gpu-docker-authz``: the Docker engine's authorization plugin (serve), its health check, its install.

- ``install --prefix DIR``: write the daemon's zip archive (``install.py``) into a root-owned folder;
- ``serve --socket PATH --policy FILE --user USER``: the daemon, started as root before the engine by
  ``python3 -I -S DIR/airflow-gpu-docker-authz.pyz serve ...`` (docs/docker.md: the unit and ``daemon.json``); the
  engine knows the plugin by its socket's name (``/run/docker/plugins/airflow-gpu.sock``: ``airflow-gpu``). It reads
  the policy file once (restart it after a change) and forks its judge as ``USER`` (the workers' user);
- ``check --policy FILE [--socket PATH]``: what the daemon would read, and whether a running one answers: a call
  it must allow and one it must refuse, and how long each took. Exit status 0 when all is well.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import sys
import time
from types import SimpleNamespace
from typing import Any

log = logging.getLogger("airflow_gpu_provider.authz")


def _policy(path: str, user: str | None) -> tuple[dict[str, Any], Any]:
    from airflow_gpu_provider.policy import Policy
    from airflow_gpu_provider.policy.authz.server import worker_of
    from airflow_gpu_provider.policy.authz.settings import PolicyFileError, load

    worker = worker_of(user) if user else worker_of(str(os.getuid()))
    try:
        values = vars(load(path, worker.uid))
        Policy.of(SimpleNamespace(**values))  # malformed lists refuse the start, as a worker refuses them
    except (PolicyFileError, ValueError) as err:
        raise SystemExit(f"airflow-gpu-docker-authz: {err}") from None
    return values, worker


def serve(args: argparse.Namespace) -> int:
    """The daemon, until SIGTERM or SIGINT."""
    from airflow_gpu_provider.policy.authz.server import Daemon
    from airflow_gpu_provider.policy.authz.settings import PolicyFileError, root_only

    if os.geteuid() == 0:
        if not (sys.flags.isolated and sys.flags.no_site):
            raise SystemExit("as root, run it as python3 -I -S PREFIX/airflow-gpu-docker-authz.pyz (see install)")
        if args.user is None:
            raise SystemExit("as root, --user must name the user Airflow's workers run as (name, uid or uid:gid)")
        try:
            root_only(os.path.realpath(sys.argv[0]))
        except PolicyFileError as err:
            raise SystemExit(f"airflow-gpu-docker-authz runs from {sys.argv[0]}: {err}") from None
    values, worker = _policy(args.policy, args.user)
    daemon = Daemon(values, worker, args.engine.removeprefix("unix://"), timeout=args.timeout)

    async def run() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, task.cancel)  # type: ignore[union-attr]
        ready = asyncio.Event()
        serving = asyncio.ensure_future(daemon.serve(args.socket, ready))
        await ready.wait()
        log.info("airflow-gpu-docker-authz on %s: deployment %r, policy %s", args.socket, values["deployment"],
                 args.policy)  # fmt: skip
        await serving

    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(run())
    return 0


def check(args: argparse.Namespace) -> int:
    """What the daemon reads, and whether a running one answers as it must."""
    values, worker = _policy(args.policy, args.user)
    print(f"policy {args.policy}: deployment {values['deployment']!r}, judged as uid {worker.uid} gid {worker.gid}")
    for name, value in sorted(values.items()):
        print(f"  {name} = {value}")
    if not args.socket:
        return 0
    healthy = True
    expected = {"GET /v1.41/_ping": True, "POST /v1.41/containers/create": False}
    for call, allow in expected.items():
        method, uri = call.split(" ")
        body = {"HostConfig": {"Privileged": True}} if method == "POST" else None
        request = {"RequestMethod": method, "RequestUri": uri, "RequestHeaders": {}}
        if body is not None:
            request["RequestHeaders"] = {"Content-Type": "application/json"}
            request["RequestBody"] = base64.b64encode(json.dumps(body).encode()).decode()
        started = time.monotonic()
        try:
            answer = _post(args.socket, "/AuthZPlugin.AuthZReq", request)
        except OSError as err:
            print(f"{call}: the daemon on {args.socket} does not answer ({err})")
            return 1
        took = (time.monotonic() - started) * 1000
        good = answer.get("Allow") is allow
        healthy &= good
        print(f"{call}: {'allowed' if answer.get('Allow') else 'refused'} in {took:.0f} ms "
              f"({'as it must' if good else 'WRONG'}) {answer.get('Msg', '')}")  # fmt: skip
    return 0 if healthy else 1


def _post(path: str, call: str, payload: dict[str, Any]) -> dict[str, Any]:
    from airflow_gpu_provider.policy.authz.server import connect

    data = json.dumps(payload).encode()
    with connect(path) as connection:
        head = f"POST {call} HTTP/1.1\r\nHost: plugin\r\nContent-Length: {len(data)}\r\n\r\n"
        connection.sendall(head.encode() + data)
        response = b""
        while b"\r\n\r\n" not in response or len(response.partition(b"\r\n\r\n")[2]) < _length(response):
            chunk = connection.recv(65536)
            if not chunk:
                break
            response += chunk
    return dict(json.loads(response.partition(b"\r\n\r\n")[2]))


def _length(response: bytes) -> int:
    for line in response.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def install(args: argparse.Namespace) -> int:
    """Write the zip archive into ``--prefix``."""
    from airflow_gpu_provider.policy.authz.install import install as write

    target = write(args.prefix)
    print(f"installed {target}; run: python3 -I -S {target} serve --socket /run/docker/plugins/airflow-gpu.sock "
          "--policy /etc/airflow-gpu/policy.cfg --user WORKERS_USER")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="airflow-gpu-docker-authz", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("serve", help="the daemon (as root, with python3 -I -S from its install)")
    run.add_argument("--socket", required=True, help="where to listen: /run/docker/plugins/NAME.sock")
    run.add_argument("--engine", default="/var/run/docker.sock", help="the engine's socket (default: %(default)s)")
    run.add_argument("--timeout", type=float, default=5.0, help="seconds a judgement may take (default: %(default)s)")
    for command in (run, commands.add_parser("check", help="the policy it reads, and whether a daemon answers")):
        command.add_argument("--policy", required=True, help="the INI file with [gpu_policy], root's alone")
        command.add_argument("--user", help="the user Airflow's workers run as (name, uid or uid:gid)")
    commands.choices["check"].add_argument("--socket", help="a running daemon's socket, to ask")
    commands.add_parser("install", help="write the daemon's zip archive").add_argument("--prefix", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    return {"serve": serve, "check": check, "install": install}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
