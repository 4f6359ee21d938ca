"""scripts/cluster_check.py (``make cluster-check``): its command line, its answer where no cluster answers, and each
check's decision from recorded API answers.

No cluster runs here: the kubernetes client runs whole (its REST layer, its models), and its HTTP pool answers with
what an API server answers (recorded JSON, in the API's own shapes), so what is shown is what the script does with
each answer, not that a cluster gives it. The tasks' checks (a pod end to end, deferred, on_kill, two nodes, DRA,
Kueue) are decided here from their runs' outcomes; they ran on no cluster (docs/kubernetes-admin.md says so).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "cluster_check.py"
CHECKS = [
    "rbac", "pod-security", "cpu-pod", "gpu-pod", "deferred-pod", "on-kill", "two-node-job", "dra-claim", "kueue",
    "leftovers",
]  # fmt: skip
sys.path.insert(0, str(SCRIPT.parent))
import cluster_check as check  # noqa: E402 - scripts/ is no package

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u, namespace: ml}}]
current-context: c
"""


def cluster_check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_list_names_every_check_and_needs_no_cluster():
    done = cluster_check("--list")
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == CHECKS


def test_an_unknown_check_is_refused_naming_the_checks():
    done = cluster_check("--only", "rbac,no-such-check")
    assert done.returncode == 2 and "unknown check(s) ['no-such-check']" in done.stderr


def test_where_no_cluster_answers_it_says_so_exits_2_and_checks_nothing(tmp_path):
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)  # a closed port
    import os

    env = {**os.environ, "KUBECONFIG": str(tmp_path / "kubeconfig"), "AIRFLOW_HOME": str(tmp_path / "home")}
    done = cluster_check("--log-dir", str(tmp_path / "logs"), env=env)
    assert done.returncode == 2
    assert "cluster-check: no Kubernetes cluster answers (MaxRetryError" in done.stderr
    assert "Nothing was checked" in done.stderr and "PASS" not in done.stdout
    assert not (tmp_path / "logs").exists()
    done = cluster_check(env={**env, "KUBECONFIG": str(tmp_path / "none")})  # no kubeconfig at all
    assert done.returncode == 2 and "no Kubernetes cluster answers (ConfigException" in done.stderr


# ------------------------------------------------------------------------------------ recorded API answers
class Answers:
    """The HTTP pool of the kubernetes client: each request answered from ``routes`` (JSON), and recorded."""

    def __init__(self, routes: dict[tuple[str, str], Any]) -> None:
        self.routes, self.requests = routes, []

    def request(self, method: str, url: str, **kwargs: Any) -> urllib3.HTTPResponse:
        path = urllib3.util.parse_url(url).path
        self.requests.append((method, path, json.loads(kwargs.get("body") or "null"), kwargs.get("headers") or {}))
        answer = self.routes.get((method, path), 404)
        if callable(answer):
            answer = answer(self.requests[-1])
        status, body = (answer, {"kind": "Status", "code": answer}) if isinstance(answer, int) else (200, answer)
        return urllib3.HTTPResponse(
            body=json.dumps(body).encode(), status=status, headers={"Content-Type": "application/json"}
        )


@pytest.fixture(autouse=True)
def unrecorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check's reads are a cluster admin's, not the provider's: kept out of the RBAC check's record."""
    from backends.kubernetes import api_calls
    from kubernetes.client import ApiClient

    monkeypatch.setattr(ApiClient, "call_api", api_calls._ORIGINAL)


def connected(tmp_path: Path, routes: dict[tuple[str, str], Any]) -> tuple[check.Cluster, Answers]:
    """``Cluster.connect`` through the kubeconfig, its pool answering from ``routes``."""
    from kubernetes.client import ApiClient

    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    version = {"major": "1", "minor": "34", "gitVersion": "v1.34.1", "gitCommit": "abc", "gitTreeState": "clean"}
    version |= {"buildDate": "2025-09-09T00:00:00Z", "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}
    answers = Answers({("GET", "/version/"): version, **routes})
    original = ApiClient.__init__

    def answered(self: ApiClient, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.rest_client.pool_manager = answers

    ApiClient.__init__ = answered  # type: ignore[method-assign]
    try:
        return check.Cluster.connect(str(tmp_path / "kubeconfig"), None, None), answers
    finally:
        ApiClient.__init__ = original  # type: ignore[method-assign]


def node(name: str, *, gpus: int = 0, cpu: str = "4", taints: list | None = None, ready: bool = True) -> dict:
    """A Node as the API serves it (the fields the checks read)."""
    allocatable = {"cpu": cpu, "memory": "16Gi", "pods": "110", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"taints": taints or []},
        "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": str(ready)}]},
    }  # fmt: skip


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
ROUTES = {
    ("GET", "/api/v1/namespaces/ml"): {
        "kind": "Namespace", "apiVersion": "v1",
        "metadata": {"name": "ml", "labels": {check.PSA: "restricted", f"{check.PSA}-version": "v1.34"}},
    },
    ("GET", "/api/v1/nodes"): {
        "kind": "NodeList", "apiVersion": "v1",
        "items": [node("cpu-1"), node("cpu-2", cpu="1500m"), node("gpu-1", gpus=8, taints=[GPU_TAINT])],
    },
    ("GET", "/apis/"): {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": "resource.k8s.io", "versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}]},
        {"name": "kueue.x-k8s.io", "versions": [{"groupVersion": "kueue.x-k8s.io/v1beta2", "version": "v1beta2"}]},
    ]},
    ("GET", "/apis/resource.k8s.io/v1/deviceclasses"): {"items": [
        {"metadata": {"name": "gpu.nvidia.com"}}, {"metadata": {"name": "mig.nvidia.com"}},
    ]},
    ("GET", "/apis/kueue.x-k8s.io/v1beta2/namespaces/ml/localqueues"): {"items": [{"metadata": {"name": "team-a"}}]},
}  # fmt: skip


def test_the_facts_are_read_through_the_client_from_the_apis_answers(tmp_path):
    cluster, answers = connected(tmp_path, ROUTES)
    cluster.read()
    assert cluster.namespace == "ml"  # the context's
    assert check.decide_pod_security(cluster.facts["labels"], "restricted") == (
        "PASS",
        "enforce=restricted (version v1.34)",
    )
    assert check.gpu_nodes(cluster.facts["nodes"]) == {"gpu-1": 8}
    assert check.nodes_that_fit(cluster.facts["nodes"]) == ["cpu-1", "cpu-2"]  # gpu-1's taint: not for a CPU pod
    assert check.dra_classes(cluster.facts["served"], cluster.facts["device_classes"]) == ["gpu.nvidia.com"]
    assert cluster.facts["local_queues"] == ["team-a"]
    assert all(method == "GET" for method, *_ in answers.requests)  # reading the facts changes nothing


def test_rbac_reviews_every_permission_of_the_shipped_role_as_each_service_account(tmp_path):
    def reviewed(request: tuple) -> dict:
        _, _, body, headers = request
        attributes = body["spec"]["resourceAttributes"]
        denied = (
            headers.get("Impersonate-User", "").endswith(":airflow-worker") and attributes.get("subresource") == "exec"
        )
        return {**body, "status": {"allowed": not denied}}

    cluster, answers = connected(
        tmp_path, {("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"): reviewed}
    )
    arguments = check.parse_arguments([])
    ctx = check.Context(cluster, arguments, tmp_path, {})
    outcome = check.check_rbac(ctx)
    shipped = check.role_calls(check.ROLE_FILE.read_text())
    reviews = [r for r in answers.requests if r[0] == "POST"]
    assert len(reviews) == sum(len(calls) for calls in shipped.values())  # each permission once per Role
    assert {r[3]["Impersonate-User"] for r in reviews} == {
        "system:serviceaccount:airflow:airflow-worker", "system:serviceaccount:airflow:airflow-triggerer",
    }  # fmt: skip
    exec_review = next(r[2]["spec"]["resourceAttributes"] for r in reviews if "exec" in json.dumps(r[2]))
    assert exec_review == {"namespace": "ml", "verb": "get", "group": "", "resource": "pods", "subresource": "exec"}
    assert outcome.result == "FAIL"
    assert outcome.detail.startswith(
        "airflow-gpu-worker may not get pods/exec; airflow-gpu-worker may not create pods/exec"
    )
    assert outcome.detail.endswith(": apply deploy/kubernetes/rbac.yaml with your service accounts")


def test_the_rbac_check_needs_exactly_the_shipped_roles_permissions():
    roles = {
        doc["metadata"]["name"]: doc
        for doc in yaml.safe_load_all(check.ROLE_FILE.read_text())
        if doc and doc["kind"] == "Role"
    }
    needed = check.role_calls(check.ROLE_FILE.read_text())
    assert set(needed) == set(roles) == {"airflow-gpu-worker", "airflow-gpu-triggerer"}
    assert check.Call("create", "", "pods/exec") in needed["airflow-gpu-worker"]
    assert check.Call("watch", "", "events") in needed["airflow-gpu-triggerer"]
    everything = {role: dict.fromkeys(calls, True) for role, calls in needed.items()}
    assert check.decide_rbac(needed, everything).detail.startswith(
        "granted airflow-gpu-worker: 22/22, airflow-gpu-triggerer: 4/4"
    )
    refused = {role: dict.fromkeys(calls, "the review was refused: 403 Forbidden") for role, calls in needed.items()}
    assert "(the review was refused: 403 Forbidden)" in check.decide_rbac(needed, refused).detail


@pytest.mark.parametrize(
    ("labels", "minimum", "result", "detail"),
    [
        (
            {},
            "restricted",
            "FAIL",
            f"no Pod Security admission is enforced: label the namespace {check.PSA}=restricted",
        ),
        (
            {check.PSA: "baseline"},
            "restricted",
            "FAIL",
            "enforces 'baseline', weaker than [gpu_policy] min_pod_security='restricted'",
        ),
        ({check.PSA: "baseline"}, "baseline", "PASS", "enforce=baseline (version latest)"),
        ({check.PSA: "privileged"}, "baseline", "FAIL", "enforces 'privileged'"),
    ],
)
def test_pod_security_against_the_deployments_minimum(labels, minimum, result, detail):
    outcome = check.decide_pod_security(labels, minimum)
    assert outcome.result == result and outcome.detail.startswith(detail), outcome


def test_each_task_checks_decision_from_its_run():
    log = "[info] cluster-check: hello from cluster-check-cpu-pod-abc\n[info] Task instance state updated"
    hello = {"hello": "cluster-check", "pod": "p", "python": "3.11.7"}
    assert check.decide_task(check.TaskRun("success", hello, log), check.expect_hello).result == "PASS"
    assert check.decide_task(check.TaskRun("success", hello, "no pod log"), check.expect_hello) == (
        "FAIL", "the pod's log did not reach the task log",
    )  # fmt: skip
    failed = check.TaskRun("failed", None, "Traceback ...\nPodLaunchFailedException: Pod took too long to start\nend")
    assert check.decide_task(failed, check.expect_hello) == (
        "FAIL", "the task ended failed: PodLaunchFailedException: Pod took too long to start",
    )  # fmt: skip
    assert (
        check.decide_task(check.TaskRun("success", hello, log), check.expect_deferred).detail
        == "the task was not deferred"
    )
    deferred = check.TaskRun("success", hello, log + "\n[DAG TEST] running trigger in line")
    assert check.decide_task(deferred, check.expect_deferred).result == "PASS"
    assert check.decide_task(None, check.expect_gpu, "no node offers nvidia.com/gpu") == (
        "SKIP",
        "no node offers nvidia.com/gpu",
    )
    assert (
        check.decide_task(check.TaskRun("success", {"devices": [], "visible": ""}, ""), check.expect_gpu).result
        == "FAIL"
    )
    assert (
        check.decide_task(
            check.TaskRun("success", {"devices": ["/dev/nvidia0"], "visible": "GPU-1"}, ""), check.expect_gpu
        ).result
        == "PASS"
    )
    assert (
        check.decide_task(check.TaskRun("success", {"world_size": 1}, ""), check.expect_two).detail
        == "world size 1, not 2"
    )


def test_on_kill_passes_only_when_the_pod_ran_and_none_is_left():
    running = {"metadata": {"name": "p"}, "status": {"phase": "Running"}}
    terminating = {"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert check.decide_on_kill(True, -15, []).result == "PASS"
    assert check.decide_on_kill(True, -15, [terminating]).result == "PASS"
    assert check.decide_on_kill(True, -15, [running]) == (
        "FAIL",
        "the worker was stopped (status -15) but its pod is left: p",
    )
    assert check.decide_on_kill(False, 1, []).result == "FAIL"


def test_leftovers_count_only_the_checks_objects():
    ours = {"metadata": {"name": "cluster-check-cpu-pod-x", "labels": {"dag_id": "cluster_check_cpu_pod"}}}
    secret = {"metadata": {"name": "gpu-env-x", "labels": {"airflow-gpu-provider/dag_id": "cluster_check_dra"}}}
    theirs = {"metadata": {"name": "train-y", "labels": {"dag_id": "nightly_training"}}}
    assert check.decide_leftovers({"pod": [theirs], "Secret": []}) == ("PASS", "0 objects left")
    assert check.decide_leftovers({"pod": [ours, theirs], "Secret": [secret]}) == (
        "FAIL", "left: pod cluster-check-cpu-pod-x, Secret gpu-env-x",
    )  # fmt: skip


def test_the_table_lines_up():
    table = check.format_table([("rbac", "PASS", "granted"), ("two-node-job", "SKIP", "1 node")]).splitlines()
    assert table[0] == "check        | result | detail"
    assert table[3] == "two-node-job | SKIP   | 1 node"
    assert len({line.index("|") for line in table if "|" in line}) == 1


def test_the_check_dags_parse_into_provider_tasks(airflow_home, monkeypatch):
    """The tasks the checks run are the provider's own operators, settled at parse as a DAG author's are."""
    from helpers import load_dag

    monkeypatch.setenv("CLUSTER_CHECK_QUEUE", "team-a")
    monkeypatch.setenv("AIRFLOW__GPU__ALLOWED_KUBERNETES_OBJECTS", "kueue_queue=team-a")
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_KUBERNETES_OBJECTS", "kueue_queue=team-a")
    for dag_id in (
        "cluster_check_cpu_pod",
        "cluster_check_deferred_pod",
        "cluster_check_two_nodes",
        "cluster_check_kueue",
    ):
        spec = load_dag(check.DAGS, dag_id).get_task("check").task_spec
        assert spec.backend == "kubernetes", dag_id
    assert load_dag(check.DAGS, "cluster_check_two_nodes").get_task("check").task_spec.num_nodes == 2
    assert load_dag(check.DAGS, "cluster_check_deferred_pod").get_task("check").task_spec.deferrable
