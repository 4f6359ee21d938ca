"""What the API server answers, for the deferrable tests: canned objects, given as the answers of the kubernetes
client's methods (``CoreV1Api``, ``BatchV1Api``, ``ResourceV1Api``), PodManager's exec calls into the XCom sidecar
and its log copy, and, for the triggers, AsyncKubernetesHook's reads of a pod, its events and a Job: the only cluster
calls. Every call is recorded. Everything else is the real code: KubernetesPodOperator, PodManager, the hooks (with a
kubeconfig pointing at a closed port), the triggers (run to their first event by :func:`fire`), the provider's
backend, and the client's generated methods themselves, whose calls ``api_calls.py`` records for the RBAC check
(where cncf code is replaced, its stand-in makes the same client call: the exec, the log read, the trigger's reads).

No cluster exists here: this shows what the provider does with each answer, not that a cluster gives it.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import json
from typing import Any

import pytest
from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook
from airflow.providers.cncf.kubernetes.utils.pod_manager import PodManager
from backends.kubernetes import api_calls
from kubernetes.client import ApiClient, BatchV1Api, CoreV1Api, ResourceV1Api
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

try:
    from airflow.sdk import serde
except ImportError:  # before Airflow 3.2 (the smoke run on the oldest supported Airflow)
    from airflow.serialization import serde  # type: ignore[no-redef]

from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.backends.kubernetes.multinode import JOB_LABEL
from airflow_gpu_provider.backends.kubernetes.pod_operator import to_dict, to_model
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}
users:
- name: nobody
  user: {token: "not-a-token"}
contexts:
- name: nowhere
  context: {cluster: nowhere, user: nobody}
current-context: nowhere
"""
EMPTY_XCOM = "__airflow_xcom_result_empty__"
#: The client's methods as generated (before any test gives answers): what the stand-ins of cncf code call
GENERATED = {api: dict(vars(api)) for api in (CoreV1Api, BatchV1Api, ResourceV1Api)}
#: The objects a pod's companions are, by the client's method names (``create_namespaced_secret``, ...)
COMPANIONS = {"secret": ("Secret", "V1Secret"), "resource_claim_template": ("ResourceClaimTemplate", None)}
CONNECTION_EXTRA = {"xcom_sidecar_container_image": "registry.example.com/alpine:3.20"}


def kubeconfig_file(tmp_path: Any, monkeypatch: Any) -> Any:
    """A kubeconfig pointing at a closed port, and the ``gke`` connection (with an extra, and no kubeconfig)."""
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    monkeypatch.setenv("AIRFLOW_CONN_GKE", json.dumps({"conn_type": "kubernetes", "extra": CONNECTION_EXTRA}))
    return path


def planned(kubeconfig, *, policy="fail", durable=True, num_nodes=1, conf=None, **options):
    """A Kubernetes backend and its plan: 4 GPUs and 8Gi, through the ``gke`` connection and a kubeconfig file."""
    request = TaskRequest(
        ResourceSettings(gpu_count=4, memory="8Gi"),
        ImageSettings(),
        Envelope.run(["python3", "-c", "print('hi')"]),
        policy,  # type: ignore[arg-type]
        {"dag_id": "d", "task_id": "train", "run_id": "manual", "try_number": "1", "map_index": "-1"},
        num_nodes=num_nodes,
        durable=durable,
    )
    backend = BACKENDS["kubernetes"].create(
        {
            "namespace": "ml",
            "kubernetes_conn_id": "gke",
            "config_file": str(kubeconfig),
            "in_cluster": False,
            "pending_timeout": 120,
            "startup_timeout": 900,
            **options,
        }
    )
    return backend, backend.plan(request, conf or GpuConfig.read())


class TaskInstance:
    """What KubernetesPodOperator reads of ``context["ti"]``: identity, start, XCom pushes."""

    dag_id, task_id, map_index, try_number = "d", "train", -1, 1

    def __init__(self) -> None:
        self.start_date = datetime.datetime.now(datetime.UTC)
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


class StateStore:
    """``context["task_state_store"]`` (TaskStateStoreAccessor's get/set/delete), in memory, JSON values."""

    def __init__(self, **values: Any) -> None:
        self.values = dict(values)
        self.reads: list[str] = []

    def get(self, key: str, default: Any = None) -> Any:
        self.reads.append(key)
        return self.values.get(key, default)

    def set(self, key: str, value: Any, **_: Any) -> None:
        self.values[key] = json.loads(json.dumps(value))

    def delete(self, key: str) -> None:
        self.values.pop(key, None)


def context(store: StateStore | None = None, execution_timeout: datetime.timedelta | None = None) -> dict[str, Any]:
    """The parts of a task's context that KubernetesPodOperator and the backend read."""

    class Task:  # the running GpuStepOperator, as far as the backend reads it
        pass

    task = Task()
    task.execution_timeout = execution_timeout  # type: ignore[attr-defined]
    return {
        "ti": TaskInstance(),
        "run_id": "manual",
        "dag": None,
        "task_state_store": store or StateStore(),
        "task": task,
    }


def container(name: str, **state: Any) -> k8s.V1ContainerStatus:
    """A container's status: ``terminated={"exit_code": 137, "reason": "OOMKilled"}``, ``running={}``, ..."""
    kinds = {"terminated": k8s.V1ContainerStateTerminated, "running": k8s.V1ContainerStateRunning}
    kinds["waiting"] = k8s.V1ContainerStateWaiting
    built = {kind: kinds[kind](**value) for kind, value in state.items()}
    return k8s.V1ContainerStatus(
        name=name, image="x", image_id="", ready=False, restart_count=0, state=k8s.V1ContainerState(**built)
    )


class Cluster:
    """The API server's answers: the created pods, the pod's status as read, its log, the sidecar's file, ..."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.created: list[dict[str, Any]] = []  # pod bodies, as submitted
        self.status: k8s.V1PodStatus = k8s.V1PodStatus(phase="Pending")
        self.existing: dict[str, Any] = {}  # pods (dicts) that exist before the test's start(), by name
        self.log: list[str] = []
        self.xcom = EMPTY_XCOM
        self.events: list[str] = []
        self.jobs: list[dict[str, Any]] = []
        self.job_status: k8s.V1JobStatus | None = None
        self.earlier_labels: dict[str, str] | None = None  # the labels of a Job an earlier try submitted
        self.job_pods: list[k8s.V1Pod] = []
        self.kueue_webhook = False  # Kueue's pod webhook: a pod with a queue label is created gated, and labelled
        self.admitted = True  # Kueue has admitted the Job (unsuspended it); False: it is read as created
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}  # the Secrets and claim templates, by (kind, name)
        self.planted: dict[str, dict[str, Any]] = {}  # by kind: what someone else made first under the name created
        self.refuse_pods = False  # the API server refuses the pod (403)
        self.pending_reads = 0  # reads of the pod that find it Pending still, before ``status``

    def names(self, method: str) -> list[Any]:
        return [arg for name, arg in self.calls if name == method]

    # ------------------------------------------------------------------ CoreV1Api
    def create_namespaced_pod(self, _api: Any, namespace: str, body: dict[str, Any], **_: Any) -> k8s.V1Pod:
        self.calls.append(("create_namespaced_pod", body["metadata"]["name"]))
        if self.refuse_pods:
            raise ApiException(status=403, reason="Forbidden")
        body = {**body, "metadata": {**body["metadata"], "uid": f"uid-of-{body['metadata']['name']}"}}  # the server's
        labels = body["metadata"].get("labels") or {}
        if self.kueue_webhook and "kueue.x-k8s.io/queue-name" in labels:  # what Kueue's mutating webhook adds
            body = {**body, "metadata": {**body["metadata"], "labels": {**labels, "kueue.x-k8s.io/managed": "true"}}}
            body["spec"] = {**body["spec"], "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}
        self.created.append(body)
        return to_model(body, "V1Pod")

    def read_namespaced_pod(self, _api: Any, name: str, namespace: str, **_: Any) -> k8s.V1Pod:
        self.calls.append(("read_namespaced_pod", name))
        body = next((b for b in self.created if b["metadata"]["name"] == name), None) or self.existing.get(name)
        if body is None:
            raise ApiException(status=404, reason="Not Found")
        pod = to_model(body, "V1Pod")
        pod.status = k8s.V1PodStatus(phase="Pending") if self.pending_reads > 0 else self.status
        self.pending_reads = max(0, self.pending_reads - 1)
        return pod

    def list_namespaced_pod(self, _api: Any, namespace: str, label_selector: str = "", **_: Any) -> k8s.V1PodList:
        self.calls.append(("list_namespaced_pod", label_selector))
        return k8s.V1PodList(items=self.job_pods if JOB_LABEL in label_selector else [])

    def read_namespaced_pod_log(self, _api: Any, name: str, namespace: str, **kwargs: Any) -> Any:
        self.calls.append(("read_namespaced_pod_log", {"name": name, **kwargs}))
        if kwargs.get("_preload_content") is False:
            return [f"{line}\n".encode() for line in self.log]
        return "".join(f"{line}\n" for line in self.log)

    def list_namespaced_event(self, _api: Any, namespace: str, **_: Any) -> k8s.CoreV1EventList:
        self.calls.append(("list_namespaced_event", namespace))
        meta = k8s.V1ObjectMeta(name="e")
        items = [
            k8s.CoreV1Event(message=m, metadata=meta, involved_object=k8s.V1ObjectReference()) for m in self.events
        ]
        return k8s.CoreV1EventList(items=items)

    def patch_namespaced_pod(self, _api: Any, name: str, namespace: str, body: Any, **_: Any) -> None:
        self.calls.append(("patch_namespaced_pod", (name, body)))
        for pod in [*self.created, *self.existing.values()]:
            if pod["metadata"]["name"] == name:  # a label patch, as KubernetesPodOperator's "already_checked"
                pod["metadata"]["labels"] = {**(pod["metadata"].get("labels") or {}), **body["metadata"]["labels"]}

    def delete_namespaced_pod(self, _api: Any, name: str, namespace: str, **_: Any) -> None:
        self.calls.append(("delete_namespaced_pod", name))

    def create_namespaced_service(self, _api: Any, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.calls.append(("create_namespaced_service", body))

    def delete_namespaced_service(self, _api: Any, name: str, namespace: str, **_: Any) -> None:
        self.calls.append(("delete_namespaced_service", name))

    def delete_collection_namespaced_pod(self, _api: Any, namespace: str, label_selector: str, **_: Any) -> None:
        self.calls.append(("delete_collection_namespaced_pod", label_selector))

    # ------------------------------------------------------------------ BatchV1Api
    def create_namespaced_job(self, _api: Any, namespace: str, body: dict[str, Any], **_: Any) -> k8s.V1Job:
        self.calls.append(("create_namespaced_job", body["metadata"]["name"]))
        self.jobs.append(body)
        return k8s.V1Job(metadata=k8s.V1ObjectMeta(name=body["metadata"]["name"], uid="0f6c-uid"))

    def read_namespaced_job_status(self, _api: Any, name: str, namespace: str, **_: Any) -> k8s.V1Job:
        self.calls.append(("read_namespaced_job_status", name))
        if self.job_status is None:
            raise ApiException(status=404, reason="Not Found")
        body = next((job for job in self.jobs if job["metadata"]["name"] == name), None)
        if body is None:  # a Job submitted by an earlier try: its status is what is read
            metadata = k8s.V1ObjectMeta(name=name, namespace=namespace, labels=self.earlier_labels)
            return k8s.V1Job(metadata=metadata, status=self.job_status)
        job = to_model(body, "V1Job")  # the whole Job, as the API server returns it
        job.spec.suspend = False if self.admitted else job.spec.suspend
        job.status = self.job_status
        return job

    def delete_namespaced_job(self, _api: Any, name: str, namespace: str, **_: Any) -> None:
        self.calls.append(("delete_namespaced_job", name))

    # ------------------------------------------------------------------ PodManager: exec into the XCom sidecar
    def extract_xcom_json(self, manager: Any, pod: k8s.V1Pod) -> str:
        self.calls.append(("extract_xcom_json", pod.metadata.name))
        _exec(manager, pod, ["/bin/sh", "-c", "cat /airflow/xcom/return.json"])
        return self.xcom

    def extract_xcom_kill(self, manager: Any, pod: k8s.V1Pod) -> None:
        self.calls.append(("extract_xcom_kill", pod.metadata.name))
        _exec(manager, pod, ["/bin/sh"])

    def fetch_container_logs(self, manager: Any, pod: k8s.V1Pod, container_name: str, **kwargs: Any) -> None:
        self.calls.append(("fetch_container_logs", (pod.metadata.name, container_name, kwargs.get("follow"))))
        generated = GENERATED[CoreV1Api]["read_namespaced_pod_log"]  # what PodManager.read_pod_logs calls
        api_calls.call(generated, manager._client, pod.metadata.name, pod.metadata.namespace, container=container_name,
                       follow=bool(kwargs.get("follow")), _preload_content=False, answer=[])  # fmt: skip

    # ------------------------------------------------------------------ a pod's companions: Secrets, claim templates
    def _companion(self, method: str, *args: Any, **_: Any) -> Any:
        verb, _, plural = method.partition("_namespaced_")
        kind, model = COMPANIONS[plural]
        name = args[0] if verb != "create" else to_dict(args[1])["metadata"]["name"]
        self.calls.append((method, name))
        if verb == "create" and kind in self.planted:  # made by someone else under that name, first
            planted = json.loads(json.dumps(self.planted.pop(kind)))
            self.objects[(kind, name)] = {**planted, "metadata": {**planted.get("metadata", {}), "name": name}}
        found = self.objects.get((kind, name))
        if verb == "create":
            if found is not None:
                raise ApiException(status=409, reason="AlreadyExists")
            self.objects[(kind, name)] = found = to_dict(args[1])
        elif found is None:
            raise ApiException(status=404, reason="Not Found")
        elif verb == "patch":
            found["metadata"].update(args[2]["metadata"])
        elif verb == "delete":
            del self.objects[(kind, name)]
        return to_model(found, model) if model else found

    def install(self, monkeypatch: Any) -> Cluster:
        """Patch the client's methods (the class's: every hook's client gets them)."""
        for api, names in (
            (CoreV1Api, ("create_namespaced_pod", "read_namespaced_pod", "list_namespaced_pod")),
            (CoreV1Api, ("read_namespaced_pod_log", "list_namespaced_event", "patch_namespaced_pod")),
            (CoreV1Api, ("delete_namespaced_pod", "create_namespaced_service", "delete_namespaced_service")),
            (CoreV1Api, ("delete_collection_namespaced_pod",)),
            (BatchV1Api, ("create_namespaced_job", "read_namespaced_job_status", "delete_namespaced_job")),
        ):
            for name in names:  # the client's own method runs, and is answered (api_calls.py records the call)
                monkeypatch.setattr(api, name, api_calls.answering(GENERATED[api][name], getattr(self, name)))
        for api, plural in ((CoreV1Api, "secret"), (ResourceV1Api, "resource_claim_template")):
            for verb in ("create", "read", "patch", "delete"):
                method = f"{verb}_namespaced_{plural}"
                answer = functools.partial(self._companion, method)
                monkeypatch.setattr(
                    api,
                    method,
                    api_calls.answering(GENERATED[api][method], lambda _api, *a, _answer=answer, **k: _answer(*a, **k)),
                )
        for name in ("extract_xcom_json", "extract_xcom_kill", "fetch_container_logs"):  # cncf code, replaced
            answer = getattr(self, name)
            monkeypatch.setattr(PodManager, name, lambda manager, *a, _answer=answer, **k: _answer(manager, *a, **k))
        return self


def _exec(manager: Any, pod: k8s.V1Pod, command: list[str]) -> None:
    """The exec into the XCom sidecar that PodManager makes (through ``kubernetes.stream``): the same client call."""
    generated = GENERATED[CoreV1Api]["connect_get_namespaced_pod_exec"]
    api_calls.call(generated, manager._client, pod.metadata.name, pod.metadata.namespace,
                   container="airflow-xcom-sidecar", command=command, stderr=True, stdin=False, stdout=True, tty=False)  # fmt: skip


def fire(trigger: Any, cluster: Cluster, monkeypatch: Any) -> dict[str, Any]:
    """Run a cncf trigger as the triggerer runs it, to its first event: the payload as the worker gets it."""

    api = {kind: kind(ApiClient()) for kind in (CoreV1Api, BatchV1Api)}  # the same calls as the triggerer's client

    async def get_pod(_hook: Any, name: str, namespace: str) -> k8s.V1Pod:
        answer = cluster.read_namespaced_pod(None, name, namespace)
        return api_calls.call(
            GENERATED[CoreV1Api]["read_namespaced_pod"], api[CoreV1Api], name, namespace, answer=answer
        )

    async def watch_pod_events(_hook: Any, name: str, namespace: str, **_: Any) -> Any:
        cluster.calls.append(("watch_pod_events", name))
        generated = GENERATED[CoreV1Api]["list_namespaced_event"]
        api_calls.call(generated, api[CoreV1Api], namespace, field_selector=f"involvedObject.name={name}", watch=True)
        await asyncio.sleep(0.01)  # no events
        for message in ():
            yield message

    async def get_job_status(_hook: Any, name: str, namespace: str) -> k8s.V1Job:
        answer = cluster.read_namespaced_job_status(None, name, namespace)
        generated = GENERATED[BatchV1Api]["read_namespaced_job_status"]
        return api_calls.call(generated, api[BatchV1Api], name, namespace, answer=answer)

    monkeypatch.setattr(AsyncKubernetesHook, "get_pod", get_pod)
    monkeypatch.setattr(AsyncKubernetesHook, "watch_pod_events", watch_pod_events)
    monkeypatch.setattr(AsyncKubernetesHook, "get_job_status", get_job_status)

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    with api_calls.as_principal("triggerer"):  # the calls of the triggerer's process
        event = asyncio.run(first())
    return serde.deserialize(serde.serialize(event))


def kill(trigger: Any, cluster: Cluster, monkeypatch: Any) -> None:
    """The triggerer's ``on_kill`` of a trigger whose deferred task was stopped (Airflow 3.3+): its pod deletion."""

    async def delete_pod(_hook: Any, name: str, namespace: str, **_: Any) -> None:
        generated = GENERATED[CoreV1Api]["delete_namespaced_pod"]
        api_calls.call(
            generated,
            CoreV1Api(ApiClient()),
            name,
            namespace,
            answer=cluster.delete_namespaced_pod(None, name, namespace),
        )

    monkeypatch.setattr(AsyncKubernetesHook, "delete_pod", delete_pod)
    with api_calls.as_principal("triggerer"):
        asyncio.run(trigger.on_kill())


@pytest.fixture
def kubeconfig(tmp_path: Any, monkeypatch: Any) -> Any:
    """A kubeconfig naming a closed port (nothing is reached), as KUBECONFIG."""
    return kubeconfig_file(tmp_path, monkeypatch)


@pytest.fixture
def cluster(monkeypatch: Any) -> Cluster:
    """The cluster's answers to the kubernetes client calls (no API server can be had here)."""
    return Cluster().install(monkeypatch)
