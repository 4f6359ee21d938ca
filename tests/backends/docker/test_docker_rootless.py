"""Engines of the worker's own user (a rootless Docker engine, Podman's compatible API), for real (``user_engines.py``).

What the provider must handle there: telling the engine apart, limits the engine records but does not enforce, the
NVIDIA ``memlock`` ulimit a rootless engine cannot raise, Podman dropping a GPU request, a later try reattaching;
and what the kernel bounds whatever a container asks for (the attacker test).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import threading
import time
from pathlib import Path

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE
from backends.docker.user_engines import engines

from airflow_gpu_provider.backends.docker.backend import DockerBackend
from airflow_gpu_provider.backends.docker.client import connect
from airflow_gpu_provider.backends.docker.container import NVIDIA_ULIMITS
from airflow_gpu_provider.backends.docker.engine_facts import read_facts
from airflow_gpu_provider.backends.docker.options import DockerOptions
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import GpuUnavailableError
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.callable import shipped_callable
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaks")]
LABELS = {"dag_id": "rootless_tests", "task_id": "t", "run_id": "r", "try_number": "1", "map_index": "-1"}
PROBE = "airflow-gpu-provider-test"  # the label of the containers these tests make by hand


def task_request(function, *args, labels=LABELS, on_missing_gpu="fail", **resources) -> TaskRequest:
    envelope = Envelope.call(shipped_callable(function, owner="test"), list(args), {})
    return TaskRequest(
        ResourceSettings(**resources), ImageSettings(parent_image=BASE_IMAGE), envelope, on_missing_gpu, labels
    )


def run(task_log, req, options=None):
    backend = DockerBackend(DockerOptions.parse(options or {}), log=task_log[0])
    return backend.run(backend.plan(req, GpuConfig.read()), {})


def what_it_got() -> dict:
    import os

    shm = os.statvfs("/dev/shm")
    return {"uid": os.getuid(), "shm": shm.f_blocks * shm.f_frsize}


@engines("host", "rootless", "podman")
def test_the_log_names_the_engine_and_each_limit_it_does_not_enforce(docker_engine, task_log, request):
    kind = request.node.callspec.params["docker_engine"]
    facts = read_facts(docker_engine)
    assert (facts.rootless, facts.podman) == (kind != "host", kind == "podman")
    result = run(task_log, task_request(what_it_got, memory="256Mi", cpu_count=1, shm_size="16Mi"))
    assert result.return_value["shm"] == 16 * 2**20  # a tmpfs size: the kernel enforces it, cgroups or not
    text = task_log[1].text
    assert f"Docker engine {os.environ.get('DOCKER_HOST', 'unix://var/run/docker.sock')}: {facts.kind}" in text
    for limit, asked in (("memory", "memory=256.0 MiB"), ("cpus", "cpus=1.0")):
        said = f"{asked} is not enforced on this {facts.kind}" in text
        assert said == (limit not in facts.enforced), text  # said exactly when the engine does not enforce it
    if kind != "host":  # the container's root is the worker's user on the host (user namespaces)
        assert result.return_value["uid"] == 0
    if facts.unenforced:
        assert "limits it records but does not enforce: " + ", ".join(facts.unenforced) in text


def test_a_gpu_shaped_container_starts_on_a_rootless_engine_but_for_the_missing_runtime(
    rootless_engine, task_log, monkeypatch
):
    """``memlock -1`` made every start fail; now only the absent NVIDIA runtime does (and a CPU twin runs)."""
    client, facts = rootless_engine.client, read_facts(rootless_engine.client)
    monkeypatch.setenv("DOCKER_HOST", rootless_engine.url)
    backend = DockerBackend(DockerOptions.parse({}), log=task_log[0])
    kwargs = backend.plan(task_request(what_it_got, gpu_count=1), GpuConfig.read()).on(facts).create_kwargs(BASE_IMAGE)
    host = kwargs["host_config"]
    assert [u["name"] for u in host["ulimits"]] == ["stack"] and host["device_requests"]

    def start(host_config: dict) -> str:
        made = client.create_container(BASE_IMAGE, ["sh", "-c", "echo $(ulimit -Hl) $(ulimit -Hs)"], labels={PROBE: "1"},
                                       host_config=client.create_host_config(**host_config), user=kwargs["user"])  # fmt: skip
        try:
            client.start(made["Id"])
            client.wait(made["Id"], timeout=60)
            return client.logs(made["Id"]).decode().strip()
        except Exception as err:  # the engine's refusal is the result
            return f"refused: {err}"
        finally:
            client.remove_container(made["Id"], force=True)

    assert "could not select device driver" in start(host) and "rlimit" not in start(host)
    cpu_twin = {key: value for key, value in host.items() if key != "device_requests"}
    memlock, stack = start(cpu_twin).split()
    assert stack == "65536" and memlock != "unlimited"  # the engine user's own memlock: never raised
    before = start({**cpu_twin, "ulimits": [dict(u) for u in NVIDIA_ULIMITS]})  # the call as it was made
    assert "refused" in before and "rlimit" in before
    with pytest.raises(GpuUnavailableError, match="NVIDIA Container Toolkit") as failed:  # end to end
        run(task_log, task_request(what_it_got, gpu_count=1))
    assert "rlimit" not in str(failed.value)
    assert "memlock ulimit: a rootless engine cannot raise it" in task_log[1].text


@engines("podman")
def test_podman_refuses_a_gpu_task_it_would_run_without_its_gpus(docker_engine, task_log, monkeypatch):
    """Its compatible API drops ``device_requests`` (the task ran, without a GPU); CDI names need a Podman that
    takes them. Both are refused naming the fix; ``on_missing_gpu='cpu'`` runs on the CPU, saying why.
    """
    with pytest.raises(GpuUnavailableError, match=r"dropped the GPU request.*nvidia-ctk cdi generate"):
        run(task_log, task_request(what_it_got, gpu_count=1))
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0")  # a GPU the host allocator hands out: named by CDI
    backend = DockerBackend(DockerOptions.parse({}), log=task_log[0])
    plan = backend.plan(task_request(what_it_got, gpu_count=1), GpuConfig.read()).on(read_facts(docker_engine))
    host = plan.on_devices(["0"]).create_kwargs(BASE_IMAGE)["host_config"]
    assert host["devices"] == ["nvidia.com/gpu=0:nvidia.com/gpu=0:rwm"] and "device_requests" not in host
    with pytest.raises(GpuUnavailableError, match=r"CDI devices.*nvidia\.com/gpu=0.*nvidia-ctk cdi generate"):
        backend.run(plan, {})
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "none")
    result = run(task_log, task_request(what_it_got, gpu_count=1, on_missing_gpu="cpu"))
    assert result.return_value["uid"] == 0 and "running on CPU instead" in task_log[1].text


class Store:
    """A task state store (Airflow's ``TaskStateStoreAccessor``: get, set, delete) of one task instance."""

    def __init__(self) -> None:
        self.values: dict = {}

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value, **_):
        self.values[key] = value

    def delete(self, key):
        self.values.pop(key, None)


def answer_when_let_go() -> int:
    """Work until the test lets go (a file ``/tmp/go`` in the container), a minute at most."""
    import os
    import time

    print("thinking", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not os.path.exists("/tmp/go"):
        time.sleep(0.2)
    return 42


@engines("rootless")  # the host's: the failure matrix (a worker killed with SIGKILL)
def test_a_later_try_reattaches_to_the_container_an_earlier_try_left_running(docker_engine, task_log):
    context = {"task_state_store": Store()}
    first = DockerBackend(DockerOptions.parse({}), log=task_log[0])
    record = first.submit(first.plan(task_request(answer_when_let_go), GpuConfig.read()), context)
    first._started.held.close()  # the first worker dies here: nothing of it follows the container
    second = DockerBackend(DockerOptions.parse({}), log=task_log[0])
    plan = second.plan(task_request(answer_when_let_go, labels={**LABELS, "try_number": "2"}), GpuConfig.read())
    assert second.job_active(second.job_status(plan, record, context))

    def let_go_once_reattached() -> None:  # the second try follows the container while it still runs
        deadline = time.monotonic() + 60
        while "Reattached to container" not in task_log[1].text and time.monotonic() < deadline:
            time.sleep(0.1)
        docker_engine.exec_start(docker_engine.exec_create(record["id"], ["touch", "/tmp/go"])["Id"])

    releaser = threading.Thread(target=let_go_once_reattached, daemon=True)
    releaser.start()
    assert second.follow(plan, record, context).return_value == 42
    releaser.join(60)
    assert "Reattached to container" in task_log[1].text and "thinking" in task_log[1].text


ATTACK = r"""
try_() { if "$@" >/dev/null 2>&1; then echo yes; else echo "no ($("$@" 2>&1 >/dev/null | tail -n1))"; fi; }
echo "uid in the container: $(id -u)"
echo "write /etc: $(try_ sh -c 'echo owned > /host/etc/agpu-rootless-probe')"
echo "write /root: $(try_ sh -c 'echo owned > /host/root/agpu-rootless-probe')"
echo "read /etc/shadow: $(try_ head -c1 /host/etc/shadow)"
echo "make a root-owned file: $(try_ sh -c 'echo x > "/host$1.root" && chown 0:0 "/host$1.root" && chmod 4755 "/host$1.root"')"
for disk in /host/dev/sd? /host/dev/vd? /host/dev/nvme?n? /host/dev/xvd?; do
  [ -b "$disk" ] && echo "read $disk: $(try_ head -c1 "$disk")"
done
if [ "$2" = pid ]; then
  echo "signal the host's init: $(try_ kill -0 1)"
  echo "read init's environment: $(try_ head -c1 /proc/1/environ)"
fi
echo owned > "/host$1" && echo "wrote $1"
"""


@pytest.fixture(params=["rootless", "podman"])
def user_engine(request):
    """The engine of the worker's own user, whichever kind."""
    return request.getfixturevalue(f"{request.param}_engine")


def _attack(client, drop: Path, **host: object) -> str:
    """What the attack script says in a container of ``host`` config, or the engine's (the kernel's) refusal."""
    pid = "pid" if host.get("pid_mode") == "host" else "-"
    host_config = client.create_host_config(binds=["/:/host:rw"], privileged=True, cap_add=["ALL"], **host)
    made = client.create_container(BASE_IMAGE, ["sh", "-c", ATTACK, "sh", str(drop), pid], user="0",
                                   host_config=host_config, labels={PROBE: "attack"})  # fmt: skip
    try:
        client.start(made["Id"])
        assert client.wait(made["Id"], timeout=120)["StatusCode"] == 0
        return client.logs(made["Id"]).decode()
    except Exception as err:  # the engine could not even start it
        return f"refused: {err}"
    finally:
        client.remove_container(made["Id"], force=True)


def test_a_dag_authors_container_reaches_nothing_beyond_the_engines_user(user_engine, monkeypatch):
    """Through the provider's own client (as a DAG file's code would), bypassing every check of the provider: the
    host's ``/`` read-write, ``--privileged``, every capability, user 0, and the host's PID namespace.
    """
    monkeypatch.setenv("DOCKER_HOST", user_engine.url)
    client = connect(DockerOptions.parse({}), login=False)
    drop = Path("/tmp") / f"agpu-rootless-drop-{os.getpid()}"  # where the engine's user may write
    planted = (Path("/etc/agpu-rootless-probe"), Path("/root/agpu-rootless-probe"), Path(f"{drop}.root"), drop)
    try:
        said = _attack(client, drop)
        with_host_pids = _attack(client, drop, pid_mode="host")
        owners = {path: path.stat().st_uid for path in planted if path.exists()}  # what landed on the host
    finally:
        for path in planted:
            with contextlib.suppress(OSError):
                path.unlink()
    lines = dict(line.split(": ", 1) for line in said.splitlines() if ": " in line)
    assert lines.pop("uid in the container") == "0", said
    engine_uid = pwd.getpwnam(user_engine.user).pw_uid if user_engine.user else os.geteuid()
    # on the host: nothing in /etc or /root; what it made is the engine user's, "root-owned" and setuid ones too
    assert set(owners) <= {drop, Path(f"{drop}.root")} and set(owners.values()) == {engine_uid}, (owners, said)
    assert f"wrote {drop}" in said and drop in owners
    # in the container: the kernel said no (rootless Docker's /etc is its own copy, so a write there may succeed)
    refused = {key: answer for key, answer in lines.items() if key not in ("write /etc", "make a root-owned file")}
    assert refused and all(answer.startswith("no (") for answer in refused.values()), said
    assert "Permission denied" in lines["read /etc/shadow"] and "Permission denied" in lines["write /root"], said
    # the host's PID namespace: refused by the kernel at the start (rootless Docker cannot mount its /proc), or
    # joined with no power over the host's processes
    if not with_host_pids.startswith("refused"):
        pids = dict(line.split(": ", 1) for line in with_host_pids.splitlines() if ": " in line)
        assert pids["signal the host's init"].startswith("no (") and pids["read init's environment"].startswith("no ")
    else:
        assert "operation not permitted" in with_host_pids, with_host_pids
