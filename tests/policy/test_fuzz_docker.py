"""Fuzz over the policy layer, Docker side: any settings a DAG author may write, under any admin policy.

Each case writes a ``[gpu]`` policy (allow-lists, as the admin would in airflow.cfg) and a Docker task (resources,
``backend_options``, a checkpoint root). Either the task is refused when the DAG is parsed, or every create call
the worker would make for it (on its GPUs, and on the CPU fallback) is checked by the backend's own final check and
meets the policy by the independent rules below. The case runs the real parse path (``GpuStepOperator``), the real
plan and ``lifecycle.create_body`` (docker-py builds the body the engine would get); only the engine call is left
out. The same body also goes through the engine's authorization plugin (``policy/authz``, as the engine would send
it): the plugin and the provider's final check give it the same verdict, with the same reason.

Derandomized: the same 5000 cases on every run of ``make fuzz``, a tenth of them in ``make test``.
"""

from __future__ import annotations

import contextlib
import grp
import os
import posixpath
import pwd
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from authz_requests import written
from helpers import fuzz_cases
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import docker
from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.backends.docker.backend import DockerBackend
from airflow_gpu_provider.backends.docker.files import TaskFiles, checkpoint_folder
from airflow_gpu_provider.backends.docker.lifecycle import create_body
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.authz.judge import decide
from airflow_gpu_provider.policy.docker import DEVICE_PATHS, RUNTIME_CONTROL, SYSTEM, worker_user
from airflow_gpu_provider.policy.engine import check_create
from airflow_gpu_provider.policy.paths import UnsafePathError
from airflow_gpu_provider.render import stand_in
from airflow_gpu_provider.settings import ResourceSettings

CASES = fuzz_cases(5000)
CAPABILITIES = ["ALL", "SYS_ADMIN", "DAC_READ_SEARCH", "SYS_PTRACE", "NET_ADMIN", "IPC_LOCK", "CHOWN", "sys_admin"]
USERS = ["0", 0, "root", "0:0", "1000", "1000:1000", "1000:0", "nobody", "65534:65534", "worker", "worker-uid"]
GROUPS = ["0", "docker", "video", "render", "ml", "1000", "root"]
NETWORKS = ["bridge", "none", "host", "ml-net", "container:abc123", "default"]
IPCS = ["private", "shareable", "none", "host", "container:abc123"]
VOLUMES = ["hf-cache", "models", "docker"]
GPU = ("state_dir", "checkpoint_root")  # [gpu] options; the rest are [gpu_policy]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """Host folders to mount: allowed-looking ones, links out of them, the state dir and a checkpoint root."""
    base = tmp_path_factory.mktemp("fuzz")
    for folder in ("ro/sub", "rw/sub", "other", "state", "shared-ckpt"):
        (base / folder).mkdir(parents=True)
    (base / "state").chmod(0o700)
    (base / "ro" / "link").symlink_to("/etc")
    (base / "rw" / "sub" / "up").symlink_to("../..")
    (base / "ro" / "file").write_text("x")
    return base


def _sources(base: Path) -> list[str]:
    return [
        f"{base}/ro", f"{base}/ro/sub", f"{base}/ro/", f"/{base}/ro/sub", f"{base}/ro/link", f"{base}/ro/file",
        f"{base}/ro/../other", f"{base}/ro/./sub", f"{base}/rw", f"{base}/rw/sub", f"{base}/rw/sub/up",
        f"{base}/other", f"{base}/state", f"{base}/state/checkpoints", f"{base}/shared-ckpt", str(base),
        "/etc", "/etc/ssl", "/", "/var/run/docker.sock", "/var/run", "/var/lib/docker", "/proc/self", "/dev",
        "/root/.ssh", "/var/spool", "relative/path", "",
    ]  # fmt: skip


def _inside_roots(base: Path) -> list[str]:
    """Sources whose names pass the parse check under common roots, but which are links on the worker."""
    return [f"{base}/ro/link", f"{base}/rw/sub/up", f"{base}/ro/sub", f"{base}/rw"]


def _roots(base: Path) -> list[str]:
    return [
        f"{base}/ro:ro", f"{base}/rw:rw", f"{base}/ro:rw", f"{base}/rw/sub:ro", f"{base}/other", f"{base}:ro",
        f"{base}/state:rw", "/etc:ro", "/var/run:ro", "/var/lib/docker:ro", "/var/spool:rw", "/dev:ro",
    ]  # fmt: skip


@st.composite
def cases(draw: Any, base: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """An admin's ``[gpu]`` allow-lists and a DAG author's Docker task."""
    subset = lambda items: draw(st.lists(st.sampled_from(items), unique=True, max_size=3))  # noqa: E731
    policy = {
        "allowed_mount_roots": ",".join(draw(st.lists(st.sampled_from(_roots(base)), min_size=1, max_size=3))),
        "allowed_volumes": ",".join(subset(VOLUMES)),
        "allowed_capabilities": ",".join(subset(CAPABILITIES)),
        "allowed_users": ",".join(str(user) for user in subset(USERS)),
        "allowed_groups": ",".join(subset(GROUPS)),
        "allowed_network_modes": ",".join(subset(NETWORKS)),
        "allowed_ipc_modes": ",".join(subset(IPCS)),
        "allowed_checkpoint_roots": draw(st.sampled_from(["", f"{base}/shared-ckpt", "s3://bucket/ckpt"])),
    }
    mount = st.fixed_dictionaries(
        {
            "source": st.sampled_from(_sources(base) + VOLUMES) | st.sampled_from(_inside_roots(base)),
            "target": st.sampled_from(["/d", "/e", "/f/g"]),
        },
        optional={
            "type": st.sampled_from(["bind", "volume", "tmpfs", "npipe"]),
            "read_only": st.sampled_from([True, True, False]),
        },
    )
    mounts_only = st.fixed_dictionaries({"mounts": st.lists(mount, min_size=1, max_size=2)})
    options: dict[str, Any] = draw(
        mounts_only
        | st.fixed_dictionaries(
            {},
            optional={
                "mounts": st.lists(mount, max_size=3),
                "cap_add": st.lists(st.sampled_from(CAPABILITIES), max_size=2),
                "user": st.sampled_from(USERS),
                "group_add": st.lists(st.sampled_from(GROUPS), max_size=2),
                "network_mode": st.sampled_from(NETWORKS),
                "ipc_mode": st.sampled_from(IPCS),
                "devices": st.sampled_from([["0"], ["0", "1"], ["GPU-1"]]),
            },
        )
    )
    task = {
        "backend_options": options,
        "resources": {
            "gpu_count": draw(st.sampled_from([0, 1, 2])),
            "accelerator": draw(st.sampled_from([None, "A100", "MI300X", "Max-1550"])),
        },
        "checkpoint": draw(
            st.sampled_from([None, f"{base}/state/checkpoints", f"{base}/shared-ckpt", f"{base}/ro", "/", "s3://b/c"])
        ),
    }
    return policy, task


@contextlib.contextmanager
def _gpu_section(values: Mapping[str, str]) -> Iterator[None]:
    """``[gpu]`` as the admin wrote it, for this case (environment variables, as airflow.cfg would be read)."""
    names = {f"AIRFLOW__GPU{'' if name in GPU else '_POLICY'}__{name.upper()}": value for name, value in values.items()}
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)


def _user_of(value: Any, base_user: str) -> Any:
    own_uid = base_user.partition(":")[0]
    return {"worker": base_user, "worker-uid": own_uid}.get(str(value), value)


# ------------------------------------------------------------------ the rules, written again, independently
def _number(name: str, lookup: Any, field: str) -> int | None:
    with contextlib.suppress(KeyError):
        return int(name) if name.isdigit() else getattr(lookup(name), field)
    return None


def _listed_users(entries: frozenset[str]) -> set[tuple[int, int | None]]:
    """``(uid, gid)`` of each entry on this host; a user without a group has its primary group here."""
    pairs = set()
    for entry in entries:
        user, colon, group = entry.partition(":")
        uid = _number(user, pwd.getpwnam, "pw_uid")
        if uid is not None:
            pairs.add(
                (uid, _number(group, grp.getgrnam, "gr_gid") if colon else _number(str(uid), pwd.getpwuid, "pw_gid"))
            )
    return pairs


def _beneath(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _meets(body: Mapping[str, Any], policy: Policy, provider_sources: list[str]) -> None:
    """Assert the create body gives the task nothing beyond ``policy`` (docs/security.md, Docker rules)."""
    host = body["HostConfig"]
    assert not host.get("Privileged") and host["CapDrop"] == ["ALL"]
    assert set(host["SecurityOpt"]) == {"no-new-privileges:true"}
    for capability in host.get("CapAdd") or []:
        assert capability.upper().removeprefix("CAP_") in policy.capabilities - {"ALL"}, capability
    for key in ("PidMode", "UsernsMode", "UTSMode", "Binds", "Sysctls", "VolumesFrom", "Links", "CgroupnsMode"):
        assert not host.get(key), key
    assert host.get("NetworkMode") in (None, "default", *policy.network_modes)
    assert host.get("IpcMode") in (None, *policy.ipc_modes)
    for device in host.get("Devices") or []:
        assert device["PathOnHost"] in DEVICE_PATHS
    gids = {_number(group, grp.getgrnam, "gr_gid") for group in (*policy.groups, "video", "render")}
    for group in host.get("GroupAdd") or []:  # numbers of this host only: the image resolves no name
        assert str(group).isascii() and str(group).isdigit() and int(group) in gids, group
    for request in host.get("DeviceRequests") or []:
        assert request["Capabilities"] == [["gpu"]]
    uid, colon, gid = str(body["User"]).partition(":")
    assert colon and f"{uid}{gid}".isascii() and uid.isdigit() and gid.isdigit(), body["User"]
    assert (int(uid), int(gid)) in {(os.geteuid(), os.getegid()), *_listed_users(policy.users)}, body["User"]
    for mount in host.get("Mounts") or []:
        source = mount["Source"]
        if mount["Type"] == "volume":
            assert source in policy.volumes
            continue
        assert mount["Type"] in ("bind", "tmpfs")
        if mount["Type"] == "tmpfs":
            continue
        assert source == posixpath.normpath(source) and not source.startswith("//"), f"{source} is not canonical"
        assert os.path.realpath(source) == source, f"{source} is reached through a link"
        if source in provider_sources:
            continue
        host_parts = [s for s in (*SYSTEM, *RUNTIME_CONTROL) if s != "/"]
        assert source != "/" and not any(_beneath(source, s) or _beneath(s, source) for s in host_parts), source
        roots = sorted((r for r in policy.mount_roots if _beneath(source, r.path)), key=lambda r: len(r.path))
        assert roots, f"{source} is beneath no allowed root"
        assert mount["ReadOnly"] or roots[-1].writable, f"{source} is writable under a read-only root"
        writable_above = [r for r in roots if r.writable and r.path != source]
        assert not writable_above, f"{source} lies beneath {writable_above[0].path}, where tasks may write"
        assert not _beneath(source, policy.state_dir) and not _beneath(policy.state_dir, source)


def _provider_verdict(body: Mapping[str, Any], policy: Policy) -> str:
    """The provider's final check on a body: ``""`` when it passes, else the refusal."""
    try:
        check_create(body, policy)
    except UnsafePathError as err:
        return str(err)
    return ""


def _plugin_verdict(body: Mapping[str, Any], policy: Policy) -> str:
    """The authorization plugin's answer to the engine showing it this create call: ``""`` when allowed."""
    [request] = written(lambda client: client.create_container_from_config(body))  # as docker-py writes it
    allowed, why = decide(request, policy, lambda kind, name: None)
    return "" if allowed else why.removeprefix("POST /v1.41/containers/create: ")


def test_every_docker_create_call_meets_the_admins_policy(tree):
    """Accepted at parse ⇒ the whole create call meets the policy; the rest is refused when the DAG is parsed."""
    outcomes = {"refused at parse": 0, "refused on the worker": 0, "checked and created": 0}
    base_user = worker_user()
    reasons: Counter[str] = Counter()

    @settings(max_examples=CASES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(cases(tree))
    def case(drawn: tuple[dict[str, str], dict[str, Any]]) -> None:
        policy_values, task = drawn
        options = dict(task["backend_options"])
        if "user" in options:
            options["user"] = _user_of(options["user"], base_user)
        section = {**policy_values, "state_dir": f"{tree}/state", "checkpoint_root": ""}
        section["allowed_users"] = ",".join(str(_user_of(u, base_user)) for u in section["allowed_users"].split(","))
        with _gpu_section(section):
            try:
                policy = Policy.current()
            except ValueError:  # the admin's own list is malformed: the worker refuses to read it
                return
            try:
                op = GpuStepOperator(
                    task_id="t",
                    command=["true"],
                    backend="docker",
                    backend_options=options,
                    resources=ResourceSettings(**task["resources"]),
                    checkpoint=task["checkpoint"] or False,
                    on_missing_gpu="cpu",
                )
            except InvalidSettingError as err:
                outcomes["refused at parse"] += 1
                reasons[getattr(err, "option", None) or err.field] += 1
                return
            conf = GpuConfig.read()
            rendered, context = stand_in(op)
            spec = rendered.rendered_spec()
            request = rendered.task_request(context, spec, conf)
            backend = DockerBackend(spec.options)
            plan = backend.plan(request, conf)
            checkpoint_folder(plan)
            client = docker.APIClient(version="1.41")
            for cpu_fallback in (False, True):
                with TaskFiles({"envelope.json": b"{}"}, parent=f"{tree}/state/docker-tasks") as files:
                    kwargs = plan.create_kwargs("img", cpu_fallback=cpu_fallback)
                    body = create_body(client, kwargs, files, plan)
                    refused = _provider_verdict(body, plan.policy)
                    assert _plugin_verdict(body, policy) == refused  # one policy: the engine's answer is the same
                    if refused:  # what no name shows: a link, a folder someone else owns
                        assert "symbolic link" in refused or "belongs to" in refused, refused
                        outcomes["refused on the worker"] += 1
                        return
                    location = request.checkpoint
                    own = [str(files.path), *([] if location is None or location.is_uri else [location.path])]
                    _meets(body, policy, own)
            outcomes["checked and created"] += 1

    case()
    print(f"\nDocker policy fuzz, {CASES} cases: {outcomes}; refused for {dict(reasons.most_common())}")
    # every side of the line was reached
    assert outcomes["refused at parse"] > CASES // 20 and outcomes["checked and created"] > CASES // 20, outcomes
    if CASES >= 5000:  # a few in 5,000 (make fuzz): a case the parse let through and the worker refused
        assert outcomes["refused on the worker"] > 0, outcomes
