"""The shipped RBAC manifest (deploy/kubernetes/rbac.yaml) grants exactly what the code's API calls need.

``api_calls.py`` records every call the Kubernetes tests make through the kubernetes client, as RBAC sees it (verb,
API group, resource/subresource), by principal: the worker, and the triggerer (a deferred task's cncf trigger). Each
principal's Role must grant every one of them (a missing permission fails the task in a cluster) and nothing more (a
permission no call uses is a permission nobody reviewed). This file runs after the other Kubernetes tests; a session
that ran only some of them runs the rest in a child pytest first, so the check always covers the whole directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from backends.kubernetes import api_calls
from backends.kubernetes.api_calls import PRINCIPALS, Call, permissions
from conftest import REPO

MANIFEST = REPO / "deploy" / "kubernetes" / "rbac.yaml"
HERE = Path(__file__).parent
#: The Role of each principal in the manifest
ROLES = {"worker": "airflow-gpu-worker", "triggerer": "airflow-gpu-triggerer"}


def _documents() -> list[dict]:
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]


def granted(role: dict) -> set[Call]:
    """Every (verb, group, resource) a Role's rules grant (no wildcards: the test refuses them)."""
    found = set()
    for rule in role["rules"]:
        assert "*" not in [*rule["verbs"], *rule["resources"], *rule["apiGroups"]], f"a wildcard in {rule}"
        assert not rule.get("resourceNames"), rule
        for group in rule["apiGroups"]:
            found |= {Call(verb, group, resource) for verb in rule["verbs"] for resource in rule["resources"]}
    return found


def recorded(session: pytest.Session, tmp_path: Path) -> dict[str, set[Call]]:
    """What the Kubernetes tests recorded: this session's, when it ran them all; else a child pytest's, which does."""
    files = sorted(p for p in HERE.glob("test_*.py") if p.name != Path(__file__).name)
    ran = {Path(str(item.path)) for item in session.items}
    options = session.config.option
    if set(files) <= ran and not (options.keyword or options.markexpr or options.deselect):
        return {principal: set(api_calls.CALLS[principal]) for principal in PRINCIPALS}
    output = tmp_path / "calls.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, files)],
        cwd=REPO, env={**os.environ, api_calls.OUTPUT: str(output)}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert output.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return {principal: {Call(*call) for call in found} for principal, found in json.loads(output.read_text()).items()}


def test_the_manifest_is_valid_and_binds_each_role_to_its_service_account():
    documents = _documents()
    for doc in documents:
        kubernetes_validate.validate(doc, "1.37", strict=True)
    roles = {doc["metadata"]["name"]: doc for doc in documents if doc["kind"] == "Role"}
    bindings = [doc for doc in documents if doc["kind"] == "RoleBinding"]
    assert set(roles) == set(ROLES.values())
    for name in ROLES.values():
        [binding] = [b for b in bindings if b["roleRef"]["name"] == name]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
        assert [s["kind"] for s in binding["subjects"]] == ["ServiceAccount"]


def test_each_role_grants_exactly_what_the_code_calls(request, tmp_path):
    calls = recorded(request.session, tmp_path)
    roles = {doc["metadata"]["name"]: doc for doc in _documents() if doc["kind"] == "Role"}
    for principal, role in ROLES.items():
        grants = granted(roles[role])
        lacking, unused = sorted(calls[principal] - grants), sorted(grants - calls[principal])
        assert not lacking, f"Role {role} lacks what the {principal}'s calls need: {lacking}"
        assert not unused, f"Role {role} grants what no call of the {principal} uses: {unused}"


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("POST", "/api/v1/namespaces/{namespace}/pods", None, {("create", "", "pods")}),
        ("GET", "/api/v1/namespaces/{namespace}/pods", [("labelSelector", "a=b")], {("list", "", "pods")}),
        ("GET", "/api/v1/namespaces/{namespace}/events", [("watch", True)], {("watch", "", "events")}),
        ("GET", "/api/v1/namespaces/{namespace}/pods/{name}/log", None, {("get", "", "pods/log")}),
        ("GET", "/api/v1/namespaces/{namespace}/pods/{name}/exec", None, {("get", "", "pods/exec"), ("create", "", "pods/exec")}),
        ("DELETE", "/api/v1/namespaces/{namespace}/pods", None, {("deletecollection", "", "pods")}),
        ("GET", "/apis/batch/v1/namespaces/{namespace}/jobs/{name}/status", None, {("get", "batch", "jobs/status")}),
        ("PATCH", "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates/{name}", None,
         {("patch", "resource.k8s.io", "resourceclaimtemplates")}),
    ],
)  # fmt: skip
def test_a_call_maps_onto_the_verb_and_resource_rbac_checks(method, path, query, expected):
    assert permissions(method, path, query) == {Call(*call) for call in expected}
