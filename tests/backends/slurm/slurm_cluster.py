"""A real Slurm cluster of the tests' own (Debian's slurm-wlm 22.05 with munge): two nodes, GPUs as GRES, REST.

Started once per session, when a test first asks for it, and stopped on every path; nothing of the host's Slurm or
munge is used or touched. Under one temp dir: a ``munged`` with a key and socket of its own, ``slurmctld`` and two
``slurmd`` (free ports; spool, state, pid and log files of their own; ``SlurmUser=root``), and ``slurmrestd``
with JWT (``AuthAltTypes=auth/jwt``, a key of its own). Each node has two "GPUs": GRES over character devices made
with ``mknod`` (``c 195 N``, as ``/dev/nvidiaN``): node 1 an ``a100`` and an ``h100``, node 2 an ``a100`` (each also
a node feature of that name, and :data:`SHARDS` ``gres/shard`` of its type), so one ``h100`` exists in the whole
cluster. ``task/cgroup`` limits a job's memory
(its end is ``OUT_OF_MEMORY``), ``MinJobAge`` is short, a requeued job may start again after 5 s
(``cred_expire``), and a random ``FirstJobId`` keeps the job ids (and so the cgroup folders) apart from another
session's cluster. Partitions: ``low`` (the default) and ``high`` over both nodes, ``high`` preempting ``low``
(``preempt/partition_prio``, ``PreemptMode=REQUEUE``), and ``quick`` (the last node, a one-minute ``MaxTime``).

Node 2 is another host to ``slurmctld``: a ``slurmd`` in a network namespace of its own (``ip netns``), reached
through a veth pair (node 1 on the host's end). Each node's processes see a ``/etc/hosts`` of their own (a bind
mount in a mount namespace of their own) where the host name is the node's address, so that what a job binds to by
host name (torch's gloo) is reachable from the other node. The nodes are named after the session (``s<hex>n1``),
so their cgroup folders (``slurm_<node>``) are theirs alone; stopping the cluster ends what is left in them.

Without what it needs (root; the binaries; ``ip netns``) the Slurm tests skip, saying so; in CI they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

NEEDED = (
    "munged",
    "mungekey",
    "slurmctld",
    "slurmd",
    "slurmrestd",
    "sbatch",
    "scontrol",
    "ip",
    "nsenter",
    "unshare",
    "mount",
)
START_TIMEOUT = 60.0
#: what slurmrestd serves (its ``dbv0.0.3x`` plugins need slurmdbd, which the cluster has not)
REST_PLUGINS = "openapi/v0.0.36,openapi/v0.0.37,openapi/v0.0.38"
IN_CI = os.environ.get("CI") == "true"
#: ``gres/shard``s of each GPU (a share of one GPU is a number of them: the connection's accelerators map says so)
SHARDS = 4
#: a daemon ends when the test process that started it dies (``prctl(PR_SET_PDEATHSIG)``), then execs
_DIE_WITH_TESTS = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); os.execvp(sys.argv[1], sys.argv[1:])"
)
#: a node's own /etc/hosts (``$1``), then its daemon
_OWN_HOSTS = 'mount --make-rprivate / && mount --bind "$1" /etc/hosts && shift && exec "$@"'


def why_not() -> str | None:
    """Why a cluster cannot start here, or ``None``."""
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root (slurmd, mknod and ip netns need it)")
    if not missing:
        return None
    return f"a test Slurm cluster needs {', '.join(missing)} (apt-get install slurm-wlm slurmrestd munge iproute2)"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


@dataclass
class SlurmCluster:
    """A running cluster: its configuration file (``SLURM_CONF`` of a submit host), REST URL, nodes and folders."""

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="agpu-slurm-")))
    name: str = field(default_factory=lambda: f"s{random.getrandbits(24):06x}")
    nodes: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    rest_url: str = ""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    netns: str = ""

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def shared(self) -> Path:
        """The folder every node (and the worker) sees at the same path: the provider's ``shared_dir``."""
        return self.root / "shared"

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, scontrol, ...) of this cluster needs."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> str:
        """A Slurm client command against this cluster; its output."""
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, check=False, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr}")
        return done.stdout

    def token(self, lifespan: int = 3600) -> str:
        """A JWT for slurmrestd, from slurmctld (``scontrol token``)."""
        out = self.run("scontrol", "token", "username=root", f"lifespan={lifespan}")
        return out.strip().partition("SLURM_JWT=")[2]

    def jobs(self) -> list[dict[str, object]]:
        """The jobs slurmctld knows (``squeue --json``), ended ones within ``MinJobAge`` included."""
        return list(json.loads(self.run("squeue", "--json", "--states=all"))["jobs"])

    def connection(self, rest: bool = False, **extra: object) -> str:
        """An Airflow connection (JSON, for ``AIRFLOW_CONN_...``) of type ``slurm`` to this cluster."""
        facts: dict[str, object] = {
            "shared_dir": str(self.shared),
            "accelerators": {model: {"gres": model.lower(), "shards": SHARDS} for model in ("A100", "H100")},
            "python": sys.executable,  # the nodes' Python: this machine's, with the tests' packages (and uv)
            "path": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            **extra,
        }
        if rest:
            return json.dumps(
                {"conn_type": "slurm", "host": self.rest_url, "login": "root", "password": self.token(), "extra": facts}
            )
        return json.dumps({"conn_type": "slurm", "extra": {"slurm_conf": str(self.conf), **facts}})

    # ------------------------------------------------------------------ start
    def start(self, nodes: int = 2) -> SlurmCluster:
        self.root.chmod(0o755)  # slurmrestd reads the configuration as nobody
        for folder in ("etc", "state", "log", "munge", "socket", "shared", "dev"):
            (self.root / folder).mkdir()
        (self.root / "munge").chmod(0o700)
        self.shared.chmod(0o1777)
        self.nodes = [f"{self.name}n{index + 1}" for index in range(nodes)]
        self._network(nodes)
        self._munge()
        self._write_configuration()
        self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait_for(lambda: self.run("scontrol", "ping", check=False).count("UP") > 0, "slurmctld")
        for index, node in enumerate(self.nodes):
            (self.root / "state" / f"spool-{node}").mkdir()
            hosts = self.root / "etc" / f"hosts-{node}"
            names = "".join(f"{address} {name}\n" for address, name in zip(self.addresses, self.nodes, strict=True))
            hosts.write_text(f"127.0.0.1 localhost\n{self.addresses[index]} {socket.gethostname()}\n{names}")
            argv = ["unshare", "-m", "sh", "-c", _OWN_HOSTS, "-", str(hosts), "slurmd", "-D", "-N", node]
            if index > 0:
                argv = ["nsenter", f"--net=/run/netns/{self.netns}", *argv]  # (ip netns exec hides /sys/fs/cgroup)
            self._daemon(f"slurmd-{node}", [*argv, "-f", str(self.conf)])
        self._wait_for(self._nodes_idle, f"{nodes} idle nodes")
        port = free_port()
        self.rest_url = f"http://127.0.0.1:{port}"
        rest = [
            "slurmrestd",
            "-f",
            str(self.conf),
            "-a",
            "rest_auth/jwt",
            "-s",
            REST_PLUGINS,
            "-u",
            "nobody",
            f"127.0.0.1:{port}",
        ]
        self._daemon("slurmrestd", rest, SLURM_JWT="daemon")
        self._wait_for(lambda: _answers(port), "slurmrestd")
        return self

    def _network(self, nodes: int) -> None:
        """The nodes' addresses: a veth pair between the host and node 2's namespace (one node: 127.0.0.1)."""
        if nodes == 1:
            self.addresses = ["127.0.0.1"]
            return
        self.netns, veth = f"agpu-{self.name}", f"ag{self.name}"
        used = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, check=True).stdout
        while True:
            net = f"10.{random.randint(64, 254)}.{random.randint(0, 255)}."
            if net not in used:
                break
        self.addresses = [f"{net}1", f"{net}2"]
        for argv in (
            ["ip", "netns", "add", self.netns],
            ["ip", "link", "add", f"{veth}a", "type", "veth", "peer", "name", f"{veth}b", "netns", self.netns],
            ["ip", "addr", "add", f"{net}1/30", "dev", f"{veth}a"],
            ["ip", "link", "set", f"{veth}a", "up"],
            ["ip", "-n", self.netns, "addr", "add", f"{net}2/30", "dev", f"{veth}b"],
            ["ip", "-n", self.netns, "link", "set", f"{veth}b", "up"],
            ["ip", "-n", self.netns, "link", "set", "lo", "up"],
        ):
            subprocess.run(argv, check=True, capture_output=True)

    def _munge(self) -> None:
        key, folder = self.root / "munge" / "munge.key", self.root / "munge"
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True, capture_output=True)
        self._daemon(
            "munged",
            ["munged", "-F", f"--key-file={key}", f"--socket={self.root / 'socket' / 'munge'}",
             f"--pid-file={folder / 'pid'}", f"--seed-file={folder / 'seed'}", f"--log-file={folder / 'log'}"],
        )  # fmt: skip
        self._wait_for((self.root / "socket" / "munge").exists, "munged")

    def _write_configuration(self) -> None:
        etc, jwt_key = self.root / "etc", self.root / "state" / "jwt.key"
        jwt_key.write_bytes(os.urandom(32))
        jwt_key.chmod(0o600)
        first, host = self.addresses[0], socket.gethostname()
        lines = [
            f"ClusterName={self.name}",
            f"SlurmctldHost={host}({first})",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.root / 'socket' / 'munge'},cred_expire=5",
            "CredType=cred/munge",
            "AuthAltTypes=auth/jwt",
            f"AuthAltParameters=jwt_key={jwt_key}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'state'}/spool-%n",
            f"SlurmctldPidFile={self.root / 'state'}/slurmctld.pid",
            f"SlurmdPidFile={self.root / 'state'}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.root / 'log'}/slurmctld.log",
            f"SlurmdLogFile={self.root / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/cgroup",
            "JobAcctGatherType=jobacct_gather/linux",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "GresTypes=gpu,shard",
            f"FirstJobId={random.randint(10, 900) * 10_000}",
            "MinJobAge=30",
            "ReturnToService=2",
            "SchedulerParameters=sched_interval=1",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            "KillWait=5",
            "DefMemPerCPU=500",
            "MpiDefault=none",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
        ]
        gres = []
        for index, node in enumerate(self.nodes):
            types = ("a100", "h100") if index == 0 else ("a100",)
            devices = self.root / "dev" / node
            devices.mkdir()
            for number, kind in enumerate(types):
                os.mknod(devices / f"nvidia{number}", 0o666 | 0o020000, os.makedev(195, number))
                gres.append(f"NodeName={node} Name=gpu Type={kind} File={devices / f'nvidia{number}'}")
                gres.append(f"NodeName={node} Name=shard Type={kind} Count={SHARDS} File={devices / f'nvidia{number}'}")
            kinds = [f"gpu:{kind}:1" for kind in types] + [f"shard:{kind}:{SHARDS}" for kind in types]
            lines.append(
                f"NodeName={node} NodeAddr={self.addresses[index]} CPUs=2 RealMemory=3000 "
                f"Gres={','.join(kinds)} Features={','.join(types)} State=UNKNOWN"
            )
        every = ",".join(self.nodes)
        lines += [
            f"PartitionName=low Nodes={every} Default=YES PriorityTier=1 MaxTime=INFINITE State=UP",
            f"PartitionName=high Nodes={every} PriorityTier=2 MaxTime=INFINITE State=UP",
            f"PartitionName=quick Nodes={self.nodes[-1]} PriorityTier=1 MaxTime=1 State=UP",
        ]
        (etc / "slurm.conf").write_text("\n".join(lines) + "\n")
        (etc / "gres.conf").write_text("\n".join(gres) + "\n")
        (etc / "cgroup.conf").write_text("CgroupPlugin=autodetect\nIgnoreSystemd=yes\nConstrainRAMSpace=yes\n")

    def _daemon(self, name: str, argv: list[str], **environment: str) -> None:
        log = self.root / "log" / f"{name}.out"
        with log.open("wb") as out:
            self.processes.append(
                subprocess.Popen(
                    ["python3", "-c", _DIE_WITH_TESTS, *argv],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**self.env, **environment},
                    start_new_session=True,
                )
            )

    def _nodes_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        return {line.split()[0] for line in out.splitlines() if line.endswith(" idle")} == set(self.nodes)

    def _wait_for(self, check: object, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{process.args[3:]} exited with {process.returncode}:\n{self.logs()}")
            if check():  # type: ignore[operator]
                return
            time.sleep(0.2)
        raise RuntimeError(f"the test Slurm cluster has no {what} after {START_TIMEOUT:.0f}s:\n{self.logs()}")

    def logs(self) -> str:
        """The tails of every daemon's log."""
        tails = []
        for path in sorted((self.root / "log").glob("*")):
            tails.append(f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}")
        return "\n".join(tails)

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Cancel every job, stop the daemons, end what is left in the nodes' cgroups, remove the network and files."""
        with contextlib.suppress(Exception):
            for job in self.jobs():
                self.run("scancel", str(job["job_id"]), check=False)
        for process in reversed(self.processes):  # slurmrestd, the nodes, slurmctld, munged last
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for node in self.nodes:
            _end_cgroups(f"slurm_{node}")
        if self.netns:
            subprocess.run(["ip", "link", "del", f"ag{self.name}a"], check=False, capture_output=True)
            subprocess.run(["ip", "netns", "del", self.netns], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _end_cgroups(name: str) -> None:
    """SIGKILL every process left in a node's cgroup folders (its job steps), then remove the folders."""
    for top in Path("/sys/fs/cgroup").glob(f"*/{name}"):
        folders = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for folder in [*folders, top]:
            with contextlib.suppress(OSError):
                for pid in (folder / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 10
        for folder in [*folders, top]:
            while folder.exists() and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    folder.rmdir()
                    break
                time.sleep(0.1)


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def leftovers(slurm: SlurmCluster) -> dict[str, list[str]]:
    """The provider's active jobs, its job folders, and what a task left running (``sleep 3600``)."""
    active = [str(job["job_id"]) for job in slurm.jobs() if job["job_state"] in ("PENDING", "RUNNING", "COMPLETING")]
    folders = sorted(path.name for path in slurm.shared.glob("airflow-gpu-*/job-*"))
    escaped = [path.name for path in Path("/proc").glob("[0-9]*") if _cmdline(path) == "setsid sleep 3600"]
    escaped += [path.name for path in Path("/proc").glob("[0-9]*") if _cmdline(path) == "sleep 3600"]
    return {"jobs": active, "folders": folders, "processes": escaped}


NOTHING = {"jobs": [], "folders": [], "processes": []}


@contextlib.contextmanager
def slurm_cluster(nodes: int = 2) -> Iterator[SlurmCluster]:
    """A started cluster, stopped on every path."""
    cluster = SlurmCluster()
    try:
        yield cluster.start(nodes)
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_session() -> Iterator[tuple[SlurmCluster, dict[str, str]]]:
    """The session's two-node cluster (skip, or fail in CI, where it cannot start) and its tests' variables."""
    reason = why_not()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI=true but {reason}", pytrace=False)
        pytest.skip(reason)
    from backends.docker.docker_fixtures import make_wheel

    with slurm_cluster() as cluster:
        wheels = cluster.root / "wheels"
        wheels.mkdir()
        make_wheel(wheels, "airflow_gpu_private", "1.0", "SECRET_PACKAGE = True\n")
        variables = {
            "AIRFLOW_CONN_SLURM_TEST": cluster.connection(),
            "AIRFLOW_CONN_SLURM_REST": cluster.connection(rest=True),
            "AIRFLOW__GPU_POLICY__ALLOWED_CLUSTERS": "slurm=slurm_test, slurm=slurm_rest",  # not the default one
            "AIRFLOW_GPU_TEST_WHEELS": str(wheels),
        }
        yield cluster, variables


@pytest.fixture
def slurm(slurm_session: tuple[SlurmCluster, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The session's cluster, with two connections to it set for this test only.

    ``slurm_test`` reaches it as a submit host (the CLI, with its ``slurm.conf``), ``slurm_rest`` through
    ``slurmrestd`` with a JWT. (Set per test: a session's variables would reach the later tests of its worker.)
    """
    cluster, variables = slurm_session
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return cluster
