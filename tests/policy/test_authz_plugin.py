"""The authorization plugin's decisions: the provider's exact calls allowed, every other form refused, each call's
target judged as the engine stores it. No engine: docker-py writes the calls (``authz_requests.py``), the engine's
answers are recorded ones. The engine's side (the same calls over a socket, and their effect) is in
tests/backends/docker/test_docker_authz.py; the daemon run as it runs, in test_authz_daemon.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from authz_requests import DATA, ID, lookup, raw, stored_container, written

from airflow_gpu_provider.backends.docker.images.install import _commit
from airflow_gpu_provider.backends.docker.images.recipe import Recipe
from airflow_gpu_provider.backends.docker.plan import RESULT_LABEL, RESULT_PATH
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.authz import judge
from airflow_gpu_provider.policy.authz.calls import FORMS, Refused, match
from airflow_gpu_provider.policy.authz.judge import decide
from airflow_gpu_provider.policy.authz.stored import DEPLOYMENT_LABEL, as_created, check_container
from airflow_gpu_provider.policy.docker import worker_user
from airflow_gpu_provider.policy.paths import UnsafePathError

DEPLOYMENT = "ml-prod"
LABELS = {DEPLOYMENT_LABEL: DEPLOYMENT}
IMAGE = "airflow-gpu-derived:0123456789abcdef"
SAFE = {"Image": "img", "User": worker_user(), "Labels": LABELS,
        "HostConfig": {"CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges:true"]}}  # fmt: skip


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    """This deployment's policy, its state dir holding the task files folder of the recorded container."""
    (tmp_path / "state" / "docker-tasks" / "task-w-abc").mkdir(parents=True)
    (tmp_path / "state").chmod(0o700)
    conf = GpuConfig.read(deployment=DEPLOYMENT, state_dir=str(tmp_path / "state"), allowed_volumes="models")
    return Policy.of(conf)


@pytest.fixture
def ours(policy: Policy) -> dict:
    """The recorded provider container, its files folder in this policy's state dir."""
    source = f"{policy.state_dir}/docker-tasks/task-w-abc"
    mounts = [{"ReadOnly": True, "Source": source, "Target": "/airflow-gpu", "Type": "bind"}]
    return stored_container(Mounts=mounts, Config={"User": worker_user()})


def verdicts(requests: list[dict], policy: Policy, things: dict) -> list[tuple[bool, str]]:
    return [decide(request, policy, lookup(things)) for request in requests]


def test_every_call_the_provider_makes_is_allowed(policy, ours):
    """docker-py writes each of the provider's calls; the plugin allows each, judging its target as stored."""
    image = {"Id": "sha256:" + "a" * 64, "Config": {"Labels": LABELS}}
    things = {("container", ID): {**ours, "Id": ID}, ("image", IMAGE): image, ("volume", "models"): None}
    create = {
        **SAFE,
        "HostConfig": {
            **SAFE["HostConfig"],
            "Mounts": [
                {
                    "Type": "volume",
                    "Source": "models",
                    "Target": "/m",
                    "ReadOnly": True,
                    "VolumeOptions": {"NoCopy": True},
                }
            ],
        },
    }
    recipe = Recipe((("true",),), (), (("A", "1"),))
    calls = [
        lambda c: c.ping(), lambda c: c.containers(all=True, filters={"label": "airflow-gpu-provider.worker"}),
        lambda c: c.create_container_from_config(create), lambda c: c.inspect_container(ID), lambda c: c.start(ID),
        lambda c: c.wait(ID), lambda c: c.stop(ID, timeout=30), lambda c: c.remove_container(ID, force=True),
        lambda c: c.remove_container(ID, force=True, v=True), lambda c: c.put_archive(ID, "/", b"tar"),
        lambda c: _commit(c, ID, IMAGE, {"Cmd": ["python3"]}, recipe, labels={"x": "1", **LABELS}),
        lambda c: c.images(filters={"label": "airflow-gpu-provider.derived=true"}),
        lambda c: c.images(all=True, filters={"label": "airflow-gpu-provider.builder=h:1:2", "dangling": True}),
        lambda c: c.inspect_image("pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"),
        lambda c: c.pull("reg.example.com:5000/ml/base", tag="1.0"),
        lambda c: c.push("airflow-gpu-derived", tag="0123456789abcdef"), lambda c: c.remove_image(IMAGE),
        lambda c: c.remove_image("sha256:" + "b" * 64, noprune=True),
    ]  # fmt: skip
    for call in calls:
        for request in written(call):
            assert decide(request, policy, lookup(things)) == (True, ""), request
    for uri in (f"/v1.41/containers/{ID}/logs?stderr=1&stdout=1&timestamps=0&follow=1&tail=all&since=1795843392.93",
                f"/v1.41/containers/{ID}/logs?stderr=0&stdout=1&timestamps=0&follow=0&tail=4098",
                f"/v1.41/containers/{ID}/archive?path=%2Ftmp%2Fairflow-gpu-result.json", "/version"):  # fmt: skip
        assert decide(raw("GET", uri, User_Agent="docker-sdk-python/7.2.0"), policy, lookup(things)) == (True, "")
    attach = raw("POST", f"/v1.41/containers/{ID}/attach?logs=0&stdout=1&stderr=1&stream=1", Content_Length="0",
                 Connection="Upgrade", Upgrade="tcp")  # fmt: skip
    assert decide(attach, policy, lookup(things)) == (True, "")


def test_the_table_holds_the_calls_recorded_across_the_docker_tests_and_nothing_else():
    """Every call the provider made in the Docker tests (recorded through a logging proxy, one of each form) matches
    a form, and every form but a registry login (DockerHook's, where docker_conn_id names one) was made."""
    recorded = json.loads((DATA / "calls.json").read_text())
    used = {match(request, _shown(request)).form.what for request in recorded}
    assert used == {form.what for form in FORMS} - {"a registry login"}


def _shown(request: dict) -> bytes | None:
    import base64

    return base64.b64decode(request["RequestBody"]) if request.get("RequestBody") else None


CREATE = "/v1.41/containers/create"
BODY = json.dumps(SAFE).encode()
JSON = {"Content_Type": "application/json", "Content_Length": str(len(BODY))}


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (raw("POST", CREATE, BODY.replace(b'"User"', b'"user"'), **JSON), "a field the provider does not write"),
        (raw("POST", CREATE, BODY.replace(b'"SecurityOpt"', b'"\\u017fecurityOpt"'), **JSON), "does not write"),
        (raw("POST", CREATE, BODY[:-1] + b', "User": "0:0"}', **JSON), "named twice"),
        (raw("POST", CREATE, json.dumps({**SAFE, "Privileged": True}).encode(), **JSON), "does not write"),
        (raw("POST", CREATE, json.dumps({**SAFE, "HostConfig": {**SAFE["HostConfig"], "PidMode": "host"}}).encode(),
             **JSON), "does not write"),
        (raw("POST", CREATE, json.dumps({**SAFE, "Tty": 1}).encode(), **JSON), "not a JSON bool"),
        (raw("POST", CREATE, b'{"User": NaN}', **JSON), "strict JSON"),
        (raw("POST", "/v1.40/containers/create", BODY, **JSON), "older than 1.41"),
        (raw("POST", "/v1.24/containers/create", BODY, **JSON), "older than 1.41"),
        (raw("POST", "/containers/create", BODY, **JSON), "not a call the provider makes"),
        (raw("POST", "/v1.041/containers/create", BODY, **JSON), "not a call the provider makes"),
        (raw("POST", f"{CREATE}?name=x", BODY, **JSON), "not the provider's"),
        (raw("POST", "/v1.41/containers/%63reate", BODY, **JSON), "encoded"),
        (raw("GET", f"/v1.41/images/a/../../containers/{ID}/json"), "dotted"),
        (raw("POST", CREATE, BODY, Content_Type="application/json; charset=utf-8"), "must be 'application/json'"),
        (raw("POST", CREATE, None, **JSON), "shown to the plugin"),  # over 1 MiB, chunked, or a form first (H2)
        (raw("POST", CREATE, BODY, Content_Type="text/plain"), "must be 'application/json'"),
        (raw("POST", CREATE, BODY, Content_Type="application/x-www-form-urlencoded"), "must be 'application/json'"),
        (raw("POST", CREATE, BODY, **JSON, X_Registry_Config="e30="), "headers the provider's client does not send"),
        (raw("GET", "/v1.41/containers/json?all=1&all=0"), "once each"),
        (raw("GET", "/v1.41/containers/json?all=1;limit=-1"), "not written as"),
        (raw("GET", "/v1.41/images/json?filters=%7b%7d"), "not written as"),  # lower-case escapes: not requests'
        (raw("GET", '/v1.41/images/json?filters={"label":["x"]}'), "not written as"),
        (raw("GET", "/v1.41/containers/json?filters=%7B%22id%22%3A+%5B%22x%22%5D%7D"), "not the provider's"),
        (raw("DELETE", "/v1.41/images/x?force=True"), "not the provider's"),
    ],
)  # fmt: skip
def test_any_other_form_of_a_call_is_refused(request_, reason, policy):
    allowed, why = decide(request_, policy, lookup({}))
    assert not allowed and reason in why, why
    # the rule it cites is the rule that refused it: the form of an Engine API call is rule D6's, a field of a
    # create body the provider's final check's (D1-D5, or its default deny)
    assert re.search(r": rule D6: |rule D[1-5]:|default deny|Refusing the container's", why), why


FORM = "application/x-www-form-urlencoded"


@pytest.mark.parametrize(
    ("method", "uri", "json_body"),
    [
        ("POST", "/v1.41/build?networkmode=default", False),
        ("POST", f"/v1.41/commit?container={ID}&repo=r&tag=0123456789abcdef&pause=True", True),
        ("POST", "/v1.41/images/create?fromImage=img&tag=1", False),
        ("POST", f"/v1.41/containers/{ID}/start", False),
        ("POST", CREATE, True),
    ],
)
def test_h2_a_form_body_is_refused_whatever_the_order_of_two_content_types(method, uri, json_body, policy, ours):
    """The engine shows a body when the FIRST Content-Type is JSON and hands the plugin the LAST of each header; Go
    reads a form by the FIRST. Form first, JSON last: no body shown, refused. JSON first, form last: the body is shown
    but the header is no JSON, refused. A form alone: refused. Calls without a body: any Content-Type refused.
    """
    body = b"networkmode=host&container=x&fromImage=evil"
    things = {("container", ID): {**ours, "Id": ID}}
    for shown, last in ((None, "application/json"), (body, FORM), (None, FORM), (BODY, "application/json")):
        request = raw(method, uri, shown, Content_Type=last, Content_Length=str(len(body)))
        allowed, why = decide(request, policy, lookup(things))
        if json_body and shown == BODY:
            continue  # a real JSON body: judged as such (the create passes, the commit is judged for its labels)
        assert not allowed, (shown, last, why)


def test_m1_m2_a_call_on_a_container_is_judged_by_what_the_engine_stored(policy, ours):
    """Another deployment's or an unlabelled container is out of reach (M2); one of ours whose stored configuration
    no create could have now (made before the plugin: privileged, root with a host folder) is too (M1)."""
    theirs = {**ours, "Config": {**ours["Config"], "Labels": {DEPLOYMENT_LABEL: "staging"}}}
    unlabelled = {**ours, "Config": {**ours["Config"], "Labels": {}}}
    privileged = {**ours, "HostConfig": {**ours["HostConfig"], "Privileged": True}}
    rooted = {**ours, "Config": {**ours["Config"], "User": "0:0"},
              "HostConfig": {**ours["HostConfig"], "Mounts": [{"Type": "bind", "Source": "/", "Target": "/host"}]}}  # fmt: skip
    calls = [lambda c: c.start(ID), lambda c: c.stop(ID, timeout=2), lambda c: c.remove_container(ID, force=True),
             lambda c: c.wait(ID), lambda c: c.put_archive(ID, "/", b"x"),
             lambda c: c.commit(ID, repository="r", tag="0123456789abcdef", conf={"Labels": LABELS})]  # fmt: skip
    for container, reason in ((theirs, "not this deployment's"), (unlabelled, "not this deployment's"),
                              (privileged, "nothing privileged"), (rooted, "no create the policy allows")):  # fmt: skip
        for call in calls:
            for request in written(call):
                allowed, why = decide(request, policy, lookup({("container", ID): {**container, "Id": ID}}))
                assert not allowed and reason in why, why
    inspected = written(lambda c: c.inspect_container(ID))[0]
    assert decide(inspected, policy, lookup({("container", ID): {**privileged, "Id": ID}})) == (True, "")
    allowed, why = decide(inspected, policy, lookup({("container", ID): {**theirs, "Id": ID}}))
    assert not allowed and "not this deployment's" in why


def test_only_a_previous_releases_container_has_its_result_file_read_and_no_other_path_is(policy, ours):
    """Issue 38: a task container prints its result on its output; a 0.1.0 one (no result label) wrote the file."""
    printing = {**ours, "Config": {**ours["Config"], "Labels": {**ours["Config"]["Labels"], RESULT_LABEL: "output"}}}
    assert (judge.RESULT_FILE, judge.RESULT_LABEL) == (RESULT_PATH, RESULT_LABEL)  # the plugin's and the backend's
    result, other = (RESULT_PATH, "/etc/shadow")
    for container, path, expected in ((ours, result, True), (printing, result, False), (ours, other, False)):
        [request] = written(lambda c, path=path: c.get_archive(ID, path))
        allowed, why = decide(request, policy, lookup({("container", ID): {**container, "Id": ID}}))
        assert allowed is expected, why


@pytest.mark.parametrize(
    ("method", "uri"),
    [
        ("POST", f"/v1.41/containers/{ID}/exec"), ("POST", "/v1.41/containers/prune"), ("POST", "/v1.41/volumes/prune"),
        ("DELETE", "/v1.41/volumes/models"), ("POST", "/v1.41/volumes/create"), ("DELETE", "/v1.41/networks/bridge"),
        ("POST", "/v1.41/networks/create"), ("POST", f"/v1.41/containers/{ID}/kill"), ("POST", "/v1.41/images/load"),
        ("POST", f"/v1.41/containers/{ID}/rename?name=x"), ("POST", f"/v1.41/containers/{ID}/update"),
        ("POST", f"/v1.41/containers/{ID}/restart"), ("GET", f"/v1.41/containers/{ID}/export"),
        ("POST", "/v1.41/images/img/tag?repo=x"), ("POST", "/v1.41/plugins/pull"), ("POST", "/v1.41/swarm/init"),
        ("POST", "/v1.41/session"), ("GET", "/v1.41/events"), ("HEAD", f"/v1.41/containers/{ID}/archive?path=%2F"),
    ],
)  # fmt: skip
def test_m2_what_the_provider_never_calls_is_refused(method, uri, policy):
    allowed, why = decide(raw(method, uri), policy, lookup({}))
    assert not allowed and "not a call the provider makes" in why, why


def test_h1_no_upload_into_a_container_that_may_write_to_a_host_folder_or_a_volume(policy, ours):
    """The engine unpacks an upload as root into the container's mounts too: whatever the archive holds (H1: a tar
    Python and Go read differently), a container with a writable bind or volume gets none."""
    for mounts in ([{"Type": "bind", "Source": f"{policy.state_dir}/docker-tasks/task-w-abc", "Destination": "/c",
                     "RW": True}], [{"Type": "volume", "Name": "models", "Destination": "/m", "RW": True}]):  # fmt: skip
        container = {**ours, "Id": ID, "Mounts": mounts}
        [request] = written(lambda c: c.put_archive(ID, "/", b"\0" * 1024))
        allowed, why = decide(request, policy, lookup({("container", ID): container}))
        assert not allowed and "the engine unpacks it as root there" in why, why


def test_m3_a_listed_volume_is_mounted_without_copy_up_and_is_no_bind_in_disguise(policy):
    mount = {"Type": "volume", "Source": "models", "Target": "/m", "ReadOnly": False, "VolumeOptions": {"NoCopy": True}}
    body = {**SAFE, "HostConfig": {**SAFE["HostConfig"], "Mounts": [mount]}}
    [request] = written(lambda c: c.create_container_from_config(body))
    plain = {"Name": "models", "Driver": "local", "Options": None}
    assert decide(request, policy, lookup({("volume", "models"): plain})) == (True, "")
    bind = {**plain, "Options": {"type": "none", "o": "bind", "device": "/var/lib/secrets"}}
    nfs = {**plain, "Options": {"type": "nfs", "o": "addr=10.0.0.1", "device": ":/export"}}
    for volume in (bind, nfs, {**plain, "Driver": "sshfs"}):
        allowed, why = decide(request, policy, lookup({("volume", "models"): volume}))
        assert not allowed and "only plain local volumes" in why, why
    copied = {**body, "HostConfig": {**body["HostConfig"], "Mounts": [{**mount, "VolumeOptions": {"NoCopy": False}}]}}
    [request] = written(lambda c: c.create_container_from_config(copied))
    allowed, why = decide(request, policy, lookup({("volume", "models"): plain}))
    assert not allowed and "without copy-up" in why, why


def test_only_nvidias_ulimits_with_a_gpu_request(policy):
    gpu = [{"Driver": "", "Count": 1, "DeviceIDs": [], "Capabilities": [["gpu"]], "Options": {}}]
    nvidia = [{"Name": "memlock", "Soft": -1, "Hard": -1}, {"Name": "stack", "Soft": 67108864, "Hard": 67108864}]
    host = {**SAFE["HostConfig"], "DeviceRequests": gpu, "Ulimits": nvidia}
    assert decide(written(lambda c: c.create_container_from_config({**SAFE, "HostConfig": host}))[0], policy,
                  lookup({})) == (True, "")  # fmt: skip
    for ulimits, device_requests in (([{"Name": "rtprio", "Soft": 99, "Hard": 99}], gpu), (nvidia[:1], None),
                                     ([{"Name": "memlock", "Soft": -1, "Hard": 2}], gpu)):  # fmt: skip
        host = {**SAFE["HostConfig"], "Ulimits": ulimits, **({"DeviceRequests": gpu} if device_requests else {})}
        [request] = written(lambda c, h=host: c.create_container_from_config({**SAFE, "HostConfig": h}))
        allowed, why = decide(request, policy, lookup({}))
        assert not allowed and "HostConfig.Ulimits" in why, why


def test_a_commit_or_an_image_of_another_deployment_is_refused(policy, ours):
    things = {("container", ID): {**ours, "Id": ID}, ("image", IMAGE): {"Config": {"Labels": {}}}}
    [commit] = written(lambda c: c.commit(ID, repository="r", tag="0123456789abcdef", conf={"Labels": {}}))
    assert "committed with this deployment's label" in decide(commit, policy, lookup(things))[1]
    for call in (lambda c: c.remove_image(IMAGE), lambda c: c.push("airflow-gpu-derived", tag="0123456789abcdef")):
        allowed, why = decide(written(call)[0], policy, lookup(things))
        assert not allowed and "not this deployment's" in why, why


def test_a_stored_container_is_read_back_as_its_create_only_for_the_engines_own_defaults(policy, ours):
    info = json.loads((DATA / "provider_container.json").read_text())["info"]
    check_container(ours, policy, info)  # the provider's own, as 20.10 stores it
    assert as_created(ours, info)["HostConfig"]["CgroupnsMode"] is None
    for changes in ({"LogConfig": {"Type": "syslog", "Config": {}}}, {"Runtime": "nvidia-experimental"},
                    {"MaskedPaths": []}, {"ReadonlyPaths": None}, {"CgroupnsMode": "host"}, {"PidMode": "host"},
                    {"IpcMode": "host"}, {"Privileged": True}):  # fmt: skip
        changed = {**ours, "HostConfig": {**ours["HostConfig"], **changes}}
        engine = {**info, "CgroupVersion": "2"}  # cgroup v2: the engine's own default is a private namespace
        with pytest.raises(UnsafePathError):
            check_container(changed, policy, engine)


def test_the_plugins_table_is_docker_pys_forms_not_the_docker_clis(policy):
    """The docker CLI writes a create with every field: refused, however harmless (the exact form, not the meaning)."""
    cli = {**SAFE, "Hostname": "", "Domainname": "", "Volumes": {}, "OnBuild": None, "StopSignal": "SIGTERM"}
    [request] = written(lambda c: c.create_container_from_config(cli))
    with pytest.raises(Refused, match="a field the provider does not write"):
        match(request, _shown(request))
