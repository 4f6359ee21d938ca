"""Verify the provider's Kubernetes backend on your own cluster, and print a table of the results.

    make cluster-check          # or: .venv/bin/python scripts/cluster_check.py [--only CHECK,...] [--list]

The cluster is the kubeconfig's (``KUBECONFIG``, ``--context``), the namespace ``--namespace`` (else
``CLUSTER_CHECK_NAMESPACE``, else the context's). The checks run the provider's own objects there (its operators
through ``dag.test()``, the tasks of ``scripts/cluster_check_dags.py``), never a re-implementation:

==============  ===================================================================================================
rbac            every permission of the shipped Role (deploy/kubernetes/rbac.yaml) is granted to the workers' and
                the triggerers' service accounts (SelfSubjectAccessReview, impersonating them; --as-self: yours)
pod-security    the namespace enforces Pod Security admission at [gpu_policy] min_pod_security or stronger
cpu-pod         a CPU task end to end: its pod runs, its result comes back to XCom and its log to the task log
gpu-pod         where a node has GPUs: a one-GPU task's pod sees its GPU
deferred-pod    the CPU task deferred (deferrable=True): the trigger waits for the pod, the task collects it
on-kill         a running task stopped (SIGTERM to its worker): on_kill deletes its pod
two-node-job    where two nodes fit: AccelerateOperator(num_machines=2) as an Indexed Job, world size 2
dra-claim       where resource.k8s.io/v1 and a GPU DeviceClass exist: a one-GPU task through a ResourceClaimTemplate
kueue           where Kueue serves LocalQueues in the namespace: a task admitted through the first one (--queue)
leftovers       nothing of these checks is left: no pod, Secret, Service, Job or ResourceClaimTemplate
==============  ===================================================================================================

A check the cluster cannot have (no GPU node, no DRA, no Kueue, one node) is SKIP, with why. Exit status: 0 when no
check failed, 1 when one did, 2 when no cluster answers (nothing is checked then: nothing is faked) or the arguments
are wrong. Each check's output is kept under ``--log-dir``; a failed check's log tail is printed after the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from checks import add_selection, format_table, list_checks, selected  # scripts/, this script's folder

REPO = Path(__file__).resolve().parents[1]
DAGS = Path(__file__).with_name("cluster_check_dags.py")
ROLE_FILE = REPO / "deploy" / "kubernetes" / "rbac.yaml"
EXIT_FAILED, EXIT_NO_CLUSTER = 1, 2
MANAGED_BY = "app.kubernetes.io/managed-by=airflow-gpu-provider"
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915")
PSA = "pod-security.kubernetes.io/enforce"
MARK = "cluster-check: hello from"  # the line the check tasks print (cluster_check_dags.hello)


class Outcome(NamedTuple):
    """A check's row: ``PASS``, ``FAIL`` or ``SKIP``, and what was seen."""

    result: str
    detail: str


class Call(NamedTuple):
    """One permission, as RBAC names it: ``create`` ``""`` ``pods/exec``."""

    verb: str
    group: str
    resource: str


class TaskRun(NamedTuple):
    """A check task's run: its state, its return value, its log."""

    state: str
    value: Any
    log: str


# ------------------------------------------------------------------------------------- decisions (pure, tested)
def role_calls(manifest: str) -> dict[str, list[Call]]:
    """Each Role of the shipped manifest (``airflow-gpu-worker``, ``airflow-gpu-triggerer``) as permissions."""
    import yaml

    roles: dict[str, list[Call]] = {}
    for doc in yaml.safe_load_all(manifest):
        if doc and doc.get("kind") == "Role":
            roles[doc["metadata"]["name"]] = [
                Call(verb, group, resource)
                for rule in doc["rules"]
                for group in rule["apiGroups"]
                for resource in rule["resources"]
                for verb in rule["verbs"]
            ]
    return roles


def decide_rbac(needed: Mapping[str, Sequence[Call]], answers: Mapping[str, Mapping[Call, bool | str]]) -> Outcome:
    """PASS when every needed permission of every Role was granted; the missing ones (or the review's error) else."""
    lacking, counts = [], []
    for role, calls in needed.items():
        missing = [c for c in calls if answers.get(role, {}).get(c) is not True]
        counts.append(f"{role}: {len(calls) - len(missing)}/{len(calls)}")
        for call in missing:
            answer = answers.get(role, {}).get(call)
            why = f" ({answer})" if isinstance(answer, str) else ""
            lacking.append(f"{role} may not {call.verb} {'/'.join(filter(None, (call.group, call.resource)))}{why}")
    if lacking:
        return Outcome("FAIL", "; ".join(lacking) + ": apply deploy/kubernetes/rbac.yaml with your service accounts")
    return Outcome("PASS", "granted " + ", ".join(counts) + " (exactly the Role's permissions, which the code uses)")


def decide_pod_security(labels: Mapping[str, str] | None, minimum: str) -> Outcome:
    """The namespace's enforced Pod Security level, against ``[gpu_policy] min_pod_security``."""
    from airflow_gpu_provider.policy import LEVELS

    level = (labels or {}).get(PSA)
    fix = f"label the namespace {PSA}={minimum}"
    if level is None:
        return Outcome("FAIL", f"no Pod Security admission is enforced: {fix}")
    if level not in LEVELS or LEVELS.index(level) > LEVELS.index(minimum):
        return Outcome("FAIL", f"enforces {level!r}, weaker than [gpu_policy] min_pod_security={minimum!r}: {fix}")
    version = (labels or {}).get(f"{PSA}-version", "latest")
    return Outcome("PASS", f"enforce={level} (version {version})")


def gpu_nodes(nodes: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The nodes that offer GPUs (any vendor's extended resource), with how many."""
    found = {}
    for node in nodes:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        count = sum(int(allocatable.get(resource, 0) or 0) for resource in GPU_RESOURCES)
        if count:
            found[node["metadata"]["name"]] = count
    return found


def nodes_that_fit(nodes: Sequence[Mapping[str, Any]], cpu_millis: int = 1000) -> list[str]:
    """Ready, schedulable nodes without a taint the provider's pods do not tolerate, with ``cpu_millis`` to spare."""
    fit = []
    for node in nodes:
        spec, status = node.get("spec") or {}, node.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        taints = [t for t in spec.get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]
        cpu = str((status.get("allocatable") or {}).get("cpu", "0"))
        millis = int(cpu[:-1]) if cpu.endswith("m") else int(float(cpu) * 1000)
        if ready and not spec.get("unschedulable") and not taints and millis >= cpu_millis:
            fit.append(node["metadata"]["name"])
    return fit


def dra_classes(served: Mapping[str, Sequence[str]], device_classes: Sequence[str]) -> list[str]:
    """The GPU DeviceClasses the provider's DRA claims can name, where ``resource.k8s.io/v1`` is served."""
    from airflow_gpu_provider.backends.pods.dra import DRIVERS

    if "v1" not in served.get("resource.k8s.io", ()):
        return []
    return sorted({driver.device_class for driver in DRIVERS.values()} & set(device_classes))


def decide_task(run: TaskRun | None, expect: Callable[[TaskRun], str | None], why_skipped: str = "") -> Outcome:
    """A task check: SKIP with ``why_skipped``; FAIL when the task failed or ``expect`` names what is wrong."""
    if run is None:
        return Outcome("SKIP", why_skipped)
    if run.state != "success":
        return Outcome("FAIL", f"the task ended {run.state}: {last_error(run.log)}")
    wrong = expect(run)
    return Outcome("FAIL", wrong) if wrong else Outcome("PASS", describe(run.value))


def describe(value: Any) -> str:
    """A value in a table cell."""
    return json.dumps(value, sort_keys=True)[:200]


def last_error(log: str) -> str:
    """The task's error as its log says it (the last line of the last traceback), else the log's last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if "Error:" in line or "Exception:" in line]
    return (errors or lines or ["no log"])[-1][:300]


def expect_hello(run: TaskRun) -> str | None:
    """What is wrong with a hello task's run, or None."""
    if not isinstance(run.value, dict) or run.value.get("hello") != "cluster-check":
        return f"the result did not come back: {describe(run.value)}"
    return None if MARK in run.log else "the pod's log did not reach the task log"


def expect_deferred(run: TaskRun) -> str | None:
    """What is wrong with a deferred hello task's run, or None."""
    if "running trigger in line" not in run.log and "Pausing task as DEFERRED" not in run.log:
        return "the task was not deferred"
    return expect_hello(run)


def expect_gpu(run: TaskRun) -> str | None:
    """What is wrong with a GPU task's run (it saw no GPU), or None."""
    seen = run.value if isinstance(run.value, dict) else {}
    return None if seen.get("devices") or seen.get("visible") else f"the pod saw no GPU: {describe(run.value)}"


def expect_two(run: TaskRun) -> str | None:
    """What is wrong with the two-node launch (its world size), or None."""
    size = (run.value or {}).get("world_size") if isinstance(run.value, dict) else None
    return None if size == 2 else f"world size {size}, not 2"


def decide_on_kill(seen_running: bool, status: int | None, pods_after: Sequence[Mapping[str, Any]]) -> Outcome:
    """The pod ran, the worker was stopped, and no pod of the task is left (or each is being deleted)."""
    if not seen_running:
        return Outcome("FAIL", "the task's pod never ran, so on_kill could not be checked")
    alive = [p["metadata"]["name"] for p in pods_after if not (p.get("metadata") or {}).get("deletionTimestamp")]
    if alive:
        return Outcome("FAIL", f"the worker was stopped (status {status}) but its pod is left: {', '.join(alive)}")
    return Outcome("PASS", f"the worker was stopped (status {status}) and on_kill deleted its pod")


def decide_leftovers(found: Mapping[str, Sequence[Mapping[str, Any]]]) -> Outcome:
    """No object of the checks' DAGs (a ``dag_id`` label ``cluster_check_*``) is left in the namespace."""
    left = [
        f"{kind} {obj['metadata']['name']}"
        for kind, objects in found.items()
        for obj in objects
        if any(k.endswith("dag_id") and str(v).startswith("cluster_check") for k, v in _labels(obj).items())
    ]
    return Outcome("FAIL", "left: " + ", ".join(left)) if left else Outcome("PASS", "0 objects left")


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


# ------------------------------------------------------------------------------------------- the cluster's answers
@dataclass
class Cluster:
    """The Kubernetes API, through the kubernetes client (the provider's dependency), for what the checks read."""

    namespace: str
    api: Any
    facts: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def connect(cls, config_file: str | None, context: str | None, namespace: str | None) -> Cluster:
        """The cluster of the kubeconfig; raises when it does not answer (within seconds)."""
        from kubernetes import client, config

        loaded = client.Configuration()
        config.load_kube_config(config_file=config_file, context=context, client_configuration=loaded)
        contexts, active = config.list_kube_config_contexts(config_file=config_file)
        chosen = next((c for c in contexts if c["name"] == context), active) if context else active
        api = client.ApiClient(loaded)
        client.VersionApi(api).get_code(_request_timeout=10)
        found = namespace or (chosen.get("context") or {}).get("namespace") or "default"
        return cls(found, api)

    def review(self, call: Call, user: str | None) -> bool | str:
        """SelfSubjectAccessReview of ``call`` in the namespace, as ``user`` (impersonated) or as the caller."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        resource, _, subresource = call.resource.partition("/")
        attributes = client.V1ResourceAttributes(
            namespace=self.namespace, verb=call.verb, group=call.group, resource=resource, subresource=subresource
        )
        review = client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes)
        )
        headers = {"Impersonate-User": user} if user else {}
        try:
            done = client.AuthorizationV1Api(self.api).create_self_subject_access_review(
                review, _request_timeout=10, _headers=headers
            )
        except ApiException as err:
            return f"the review was refused: {err.status} {err.reason}"
        return bool(done.status.allowed)

    def read(self) -> None:
        """The facts the decisions need: the namespace's labels, the nodes, the APIs served, classes, queues."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        core, custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)
        self.facts["labels"] = core.read_namespace(self.namespace).metadata.labels or {}
        self.facts["nodes"] = [self.api.sanitize_for_serialization(n) for n in core.list_node().items]
        served = {g.name: [v.version for v in g.versions] for g in client.ApisApi(self.api).get_api_versions().groups}
        self.facts["served"] = served
        classes, queues = [], []
        if "v1" in served.get("resource.k8s.io", ()):
            found = custom.list_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses")
            classes = [item["metadata"]["name"] for item in found.get("items", [])]
        for version in served.get("kueue.x-k8s.io", ())[:1]:
            try:
                found = custom.list_namespaced_custom_object("kueue.x-k8s.io", version, self.namespace, "localqueues")
                queues = [item["metadata"]["name"] for item in found.get("items", [])]
            except ApiException:
                queues = []
        self.facts["device_classes"], self.facts["local_queues"] = classes, queues

    def objects(self) -> dict[str, list[dict[str, Any]]]:
        """The provider's objects in the namespace, by kind (pods as KubernetesPodOperator labels them too)."""
        from kubernetes import client

        core, batch, custom = client.CoreV1Api(self.api), client.BatchV1Api(self.api), client.CustomObjectsApi(self.api)
        ns, plain = self.namespace, self.api.sanitize_for_serialization
        found = {
            "pod": [plain(p) for p in core.list_namespaced_pod(ns, label_selector="dag_id").items],
            "Secret": [plain(s) for s in core.list_namespaced_secret(ns, label_selector=MANAGED_BY).items],
            "Service": [plain(s) for s in core.list_namespaced_service(ns).items],
            "Job": [plain(j) for j in batch.list_namespaced_job(ns).items],
        }
        if "v1" in self.facts.get("served", {}).get("resource.k8s.io", ()):
            templates = custom.list_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaimtemplates")
            found["ResourceClaimTemplate"] = templates.get("items", [])
        return found

    def pods_of(self, dag_id: str) -> list[dict[str, Any]]:
        """The pods of the check DAG ``dag_id`` (KubernetesPodOperator's ``dag_id`` label)."""
        return [p for p in self.objects()["pod"] if _labels(p).get("dag_id") == dag_id]


# ---------------------------------------------------------------------------------------------------- the checks
@dataclass
class Context:
    """What every check gets: the cluster, the command line, where logs go."""

    cluster: Cluster
    arguments: argparse.Namespace
    log_dir: Path
    environment: dict[str, str]


RUNNER = """
import json, sys
sys.path.insert(0, {scripts!r})
from airflow.dag_processing.dagbag import DagBag
from demo import xcom
bag = DagBag(dag_folder={dags!r})
if bag.import_errors:
    raise SystemExit("\\n".join(bag.import_errors.values()))
run = bag.get_dag({dag_id!r}).test()
print("CLUSTER-CHECK-RESULT", json.dumps({{"state": str(run.state), "value": xcom(run, "check")}}), flush=True)
"""


def start_task(ctx: Context, dag_id: str) -> subprocess.Popen[bytes]:
    """A worker process that runs ``dag_id`` of cluster_check_dags.py with ``dag.test()``, its output to its log."""
    code = RUNNER.format(scripts=str(DAGS.parent), dags=str(DAGS), dag_id=dag_id)
    log = (ctx.log_dir / f"{dag_id}.log").open("wb")
    return subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, env=ctx.environment)


def run_task(ctx: Context, dag_id: str, timeout: float = 1800) -> TaskRun:
    """Run ``dag_id`` in a worker process until it ends (or ``timeout``); its state, value and log."""
    worker = start_task(ctx, dag_id)
    try:
        worker.wait(timeout)
    except subprocess.TimeoutExpired:
        worker.terminate()  # its on_kill deletes the pod
        worker.wait(120)
    log = (ctx.log_dir / f"{dag_id}.log").read_text(errors="replace")
    lines = [line for line in log.splitlines() if line.startswith("CLUSTER-CHECK-RESULT ")]
    found = json.loads(lines[-1].split(" ", 1)[1]) if lines else {"state": f"no result (exit {worker.returncode})"}
    return TaskRun(found["state"], found.get("value"), log)


def check_rbac(ctx: Context) -> Outcome:
    """The shipped Role's permissions are granted to the workers' and triggerers' service accounts."""
    needed = role_calls(ROLE_FILE.read_text())
    users = {"airflow-gpu-worker": ctx.arguments.worker_sa, "airflow-gpu-triggerer": ctx.arguments.triggerer_sa}
    answers = {}
    for role, calls in needed.items():
        user = None if ctx.arguments.as_self else f"system:serviceaccount:{users[role]}".replace("/", ":")
        answers[role] = {call: ctx.cluster.review(call, user) for call in calls}
    return decide_rbac(needed, answers)


def check_pod_security(ctx: Context) -> Outcome:
    """The namespace enforces Pod Security admission at [gpu_policy] min_pod_security or stronger."""
    from airflow_gpu_provider.config.worker import GpuConfig

    return decide_pod_security(ctx.cluster.facts["labels"], GpuConfig.read().min_pod_security)


def check_cpu_pod(ctx: Context) -> Outcome:
    """A CPU task end to end: its pod, its result in XCom, its log in the task log."""
    return decide_task(run_task(ctx, "cluster_check_cpu_pod"), expect_hello)


def check_gpu_pod(ctx: Context) -> Outcome:
    """Where a node has GPUs: a one-GPU task's pod sees its GPU."""
    found = gpu_nodes(ctx.cluster.facts["nodes"])
    run = run_task(ctx, "cluster_check_gpu_pod") if found else None
    return decide_task(run, expect_gpu, f"no node offers {' or '.join(GPU_RESOURCES)}")


def check_deferred_pod(ctx: Context) -> Outcome:
    """The CPU task deferred: the trigger waits for the pod, the task collects it."""
    return decide_task(run_task(ctx, "cluster_check_deferred_pod"), expect_deferred)


def check_on_kill(ctx: Context, running_timeout: float = 900) -> Outcome:
    """A running task's worker stopped: on_kill deletes its pod."""
    dag_id = "cluster_check_on_kill"
    worker, seen, deadline = start_task(ctx, dag_id), False, time.monotonic() + running_timeout
    try:
        while not seen and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(2)
            seen = any((p.get("status") or {}).get("phase") == "Running" for p in ctx.cluster.pods_of(dag_id))
    finally:
        worker.terminate()  # what the supervisor does when a user marks the task failed: on_kill
        try:
            worker.wait(180)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    pods, deadline = ctx.cluster.pods_of(dag_id), time.monotonic() + 60
    while pods and time.monotonic() < deadline:  # a deleted pod ends within its grace period
        time.sleep(2)
        pods = ctx.cluster.pods_of(dag_id)
    return decide_on_kill(seen, worker.returncode, pods)


def check_two_node_job(ctx: Context) -> Outcome:
    """Where two nodes fit: AccelerateOperator(num_machines=2), world size 2."""
    fit = nodes_that_fit(ctx.cluster.facts["nodes"])
    run = run_task(ctx, "cluster_check_two_nodes") if len(fit) >= 2 else None
    return decide_task(run, expect_two, f"{len(fit)} node(s) fit a 1-CPU pod without a taint: two are needed")


def check_dra_claim(ctx: Context) -> Outcome:
    """Where DRA serves a GPU DeviceClass: a one-GPU task through a ResourceClaimTemplate."""
    classes = dra_classes(ctx.cluster.facts["served"], ctx.cluster.facts["device_classes"])
    run = run_task(ctx, "cluster_check_dra") if classes else None
    return decide_task(run, expect_gpu, "no resource.k8s.io/v1 GPU DeviceClass (gpu.nvidia.com, ...) on the cluster")


def check_kueue(ctx: Context) -> Outcome:
    """Where Kueue serves a LocalQueue in the namespace: a task admitted through it."""
    queues = ctx.cluster.facts["local_queues"]
    queue = ctx.arguments.queue or (queues[0] if queues else None)
    if queue is None:
        return decide_task(None, expect_hello, f"no Kueue LocalQueue in namespace {ctx.cluster.namespace}")
    ctx.environment["CLUSTER_CHECK_QUEUE"] = queue
    for section in ("GPU", "GPU_POLICY"):  # the allow-list's section: [gpu], or [gpu_policy] from 0.2.0
        ctx.environment[f"AIRFLOW__{section}__ALLOWED_KUBERNETES_OBJECTS"] = f"kueue_queue={queue}"
    return decide_task(run_task(ctx, "cluster_check_kueue"), expect_hello)


def check_leftovers(ctx: Context) -> Outcome:
    """Nothing of these checks is left in the namespace."""
    return decide_leftovers(ctx.cluster.objects())


CHECKS: dict[str, Callable[[Context], Outcome]] = {
    "rbac": check_rbac,
    "pod-security": check_pod_security,
    "cpu-pod": check_cpu_pod,
    "gpu-pod": check_gpu_pod,
    "deferred-pod": check_deferred_pod,
    "on-kill": check_on_kill,
    "two-node-job": check_two_node_job,
    "dra-claim": check_dra_claim,
    "kueue": check_kueue,
    "leftovers": check_leftovers,
}


# ------------------------------------------------------------------------------------------------ running them
def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (``--help`` describes it)."""
    parser = argparse.ArgumentParser(
        prog="cluster_check.py",
        description="Verify the provider's Kubernetes backend on your cluster and print a table.",
        epilog="Checks: " + ", ".join(CHECKS) + ". Exit status: 0 none failed, 1 a check failed, 2 no cluster.",
    )
    add_selection(parser, CHECKS)
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: $KUBECONFIG, ~/.kube")
    parser.add_argument("--context", help="the kubeconfig's context (default: its current one)")
    parser.add_argument("--namespace", default=os.environ.get("CLUSTER_CHECK_NAMESPACE"), help="default: context's")
    parser.add_argument("--image", default=os.environ.get("CLUSTER_CHECK_IMAGE"), help="the tasks' image")
    parser.add_argument("--queue", help="the Kueue LocalQueue (default: the namespace's first)")
    parser.add_argument("--worker-sa", default="airflow/airflow-worker", help="NAMESPACE/NAME of the workers' SA")
    parser.add_argument("--triggerer-sa", default="airflow/airflow-triggerer", help="NAMESPACE/NAME")
    parser.add_argument("--as-self", action="store_true", help="review your own identity, not the service accounts")
    parser.add_argument(
        "--log-dir", type=Path, help="where each check's log goes (default $AIRFLOW_HOME/cluster-check)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks; the exit status says whether one failed."""
    arguments = parse_arguments(argv)
    if arguments.list:
        list_checks(CHECKS)
        return 0
    try:
        cluster = Cluster.connect(arguments.kubeconfig, arguments.context, arguments.namespace)
    except Exception as err:  # noqa: BLE001 - no kubeconfig, a closed port, a refused token: no cluster to check
        print(
            f"cluster-check: no Kubernetes cluster answers ({type(err).__name__}: {str(err)[:300]}).\n"
            "Nothing was checked. Point KUBECONFIG (and --context) at your cluster and run it again.",
            file=sys.stderr,
        )
        return EXIT_NO_CLUSTER
    cluster.read()
    os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".airflow-home"))
    log_dir = arguments.log_dir or Path(os.environ["AIRFLOW_HOME"]) / "cluster-check"
    log_dir.mkdir(parents=True, exist_ok=True)
    from gpu_check import _ensure_migrated  # dag.test() needs a migrated metadata DB (make demo's marker)

    _ensure_migrated()
    connection = {"kube_config_path": arguments.kubeconfig, "cluster_context": arguments.context}
    extra = {key: value for key, value in {**connection, "namespace": cluster.namespace}.items() if value}
    environment = {
        **os.environ,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_CLUSTER_CHECK": json.dumps({"conn_type": "kubernetes", "extra": extra}),
        **({"CLUSTER_CHECK_IMAGE": arguments.image} if arguments.image else {}),
    }
    ctx = Context(cluster, arguments, log_dir, environment)
    names = selected(arguments, CHECKS)
    print(f"cluster-check: namespace {cluster.namespace}, {len(cluster.facts['nodes'])} node(s); logs in {log_dir}")
    rows = []
    for name in names:
        print(f"cluster-check: {name} ...", flush=True)
        started = time.monotonic()
        try:
            outcome = CHECKS[name](ctx)
        except Exception as err:  # noqa: BLE001 - any error of a check is its failure, named
            outcome = Outcome("FAIL", f"{type(err).__name__}: {str(err)[:300]}")
        rows.append((name, outcome.result, f"{outcome.detail} [{time.monotonic() - started:.0f}s]"))
    print()
    print(format_table(rows))
    failed = [name for name, result, _ in rows if result == "FAIL"]
    print(f"\ncluster-check: {len(failed)} failed, {sum(r == 'SKIP' for _, r, _ in rows)} skipped of {len(rows)}")
    return EXIT_FAILED if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
