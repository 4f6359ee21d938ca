"""One call's verdict: its form (``calls.py``), then what it may do, judged on what the engine has.

:func:`decide` answers one ``/AuthZPlugin.AuthZReq``. A create is judged by the very function the provider runs on
its own calls (``policy/engine.py`` ``check_create``) and its listed volumes as the engine has them; a call on a
container by the container the engine has stored (``stored.py``): this deployment's, and what a create could make
now; an upload only into a container without a writable host folder or volume (the engine unpacks it as root, into
the container's mounts too); a commit only with this deployment's label on the image; a push or removal only of an
image of this deployment. What the engine has is asked through ``lookup`` (the plugin's own calls to the engine).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from typing import Any

from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.authz.calls import Call, Refused, match
from airflow_gpu_provider.policy.authz.stored import DEPLOYMENT_LABEL, check_container, labelled, writable_mounts
from airflow_gpu_provider.policy.engine import check_create, check_volume
from airflow_gpu_provider.policy.paths import UnsafePathError
from airflow_gpu_provider.task.labels import docker_label

#: the result file of a task container of 0.1.0, read for one release; a later one prints its result on its output
RESULT_FILE, RESULT_LABEL = "/tmp/airflow-gpu-result.json", docker_label("result")
#: ``lookup(kind, name)``: the engine's inspect of a ``container``, ``image`` or ``volume`` (``None``: there is
#: none), or of the engine itself (``info``)
Lookup = Callable[[str, str], "Mapping[str, Any] | None"]


def decide(request: Mapping[str, Any], policy: Policy, lookup: Lookup) -> tuple[bool, str]:
    """``(allowed, why)`` of one ``AuthZReq``: default deny."""
    method, uri = str(request.get("RequestMethod") or ""), str(request.get("RequestUri") or "")
    shown = f"{method} {uri.partition('?')[0]}"
    try:
        call = match(request, _body(request))
        _target(call, policy, lookup)
        judge = JUDGES.get(call.form.what)
        if judge is not None:
            judge(call, policy, lookup)
    except Refused as err:  # the Engine API's calls: rule D6
        return False, f"{shown}: rule D6: {err}"
    except UnsafePathError as err:  # a create, a mount, a volume: the rule it breaks is in its words
        return False, f"{shown}: {err}"
    return True, ""


def _body(request: Mapping[str, Any]) -> bytes | None:
    encoded = request.get("RequestBody")
    if not encoded:
        return None
    try:
        return base64.b64decode(str(encoded), validate=True)
    except (binascii.Error, ValueError):
        raise Refused("the engine's request body is not base64") from None


def _target(call: Call, policy: Policy, lookup: Lookup) -> None:
    """The container or image the call names, as the engine has it."""
    kind = call.form.target
    if kind is None:
        return
    if kind == "image":  # pushed as NAME?tag=TAG, removed as NAME
        name = call.path["name"] + (f":{call.query['tag']}" if "tag" in call.query else "")
        found = lookup("image", name)
        if found is not None:  # none: the engine says so
            labelled(found, policy, f"the image {name!r}")
        return
    container_id = call.path.get("id") or call.query["container"]
    found = lookup("container", container_id)
    if found is None:
        return  # none with this id (ids are random, and no call makes one with a given id): the engine says so
    if kind == "container":
        labelled(found, policy, f"container {container_id[:12]}")
        return
    check_container(found, policy, lookup("info", "") or {})
    writable = writable_mounts(found)
    if call.form.what == "copy into a container" and writable:
        raise Refused(f"an upload into a container that may write to {writable}: the engine unpacks it as root there")
    own = (found.get("Config") or {}).get("Labels") or {}
    if call.query.get("path") == RESULT_FILE and own.get(RESULT_LABEL) == "output":  # backends/docker/plan.py
        raise Refused("a result file of a container that prints its result on its output: the provider reads none")


def _create(call: Call, policy: Policy, lookup: Lookup) -> None:
    check_create(call.body, policy)
    for mount in (call.body.get("HostConfig") or {}).get("Mounts") or []:
        if mount.get("Type") == "volume":
            check_volume(lookup("volume", str(mount.get("Source"))), str(mount.get("Source")))


def _commit(call: Call, policy: Policy, lookup: Lookup) -> None:
    labels = call.body.get("Labels") or {}
    if labels.get(DEPLOYMENT_LABEL) != policy.deployment:
        raise Refused(f"an image is committed with this deployment's label {DEPLOYMENT_LABEL}={policy.deployment!r}")


JUDGES: dict[str, Callable[[Call, Policy, Lookup], None]] = {
    "create a container": _create, "commit a container": _commit,
}  # fmt: skip
