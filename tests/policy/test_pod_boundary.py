"""policy/pods.py's final check beyond the Pod Security Standards: device isolation in every container (rule P4) and
the cluster objects a pod may name (rule P3, ``[gpu_policy] allowed_objects``).

On real objects: pods KubernetesPodOperator builds (``render_manifests``, with the XCom sidecar), the Indexed Job,
and KubernetesExecutor worker pods made by the cncf provider's own ``PodGenerator.construct_pod``, each validated
with kubernetes-validate (strict) and the restricted profile.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
from airflow.sdk import DAG
from backends.kubernetes.k8s_manifests import main_container, validate, with_secret
from kubernetes.client import ApiClient

from airflow_gpu_provider import AccelerateOperator, GpuStepOperator
from airflow_gpu_provider.config.policy import POD_OBJECT_KINDS
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import GpuTaskError, InvalidSettingError
from airflow_gpu_provider.policy import Policy, PolicyError
from airflow_gpu_provider.policy.pods import REFERENCES, PodSecurityError, final, unlisted
from airflow_gpu_provider.settings import ResourceSettings

CONTEXT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
CUDA_SIDECAR = {"name": "metrics", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04", "securityContext": CONTEXT}
SIDECARS = {  # a sidecar and an init container of CUDA images, one saying outright that it wants every GPU
    "spec": {
        "initContainers": [{**CUDA_SIDECAR, "name": "warmup", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}],
        "containers": [{"name": "base"}, CUDA_SIDECAR],
    }
}  # fmt: skip


def work() -> int:
    return 1


def _task(**kwargs) -> GpuStepOperator:
    with DAG("boundary", schedule=None):
        return GpuStepOperator(task_id="train", python_callable=work, backend="kubernetes", **kwargs)


def _visible(container: dict) -> list:
    return [v for v in container.get("env") or [] if v["name"] == "NVIDIA_VISIBLE_DEVICES"]


# ---------------------------------------------------------------------------------------------- rule P4
def test_every_container_without_a_gpu_gets_void_in_the_pod_kubernetes_pod_operator_builds():
    """M3: the template's sidecar and init container, the XCom sidecar; the GPU container keeps the plugin's."""
    task = _task(gpu_count=1, backend_options={"namespace": "ml", "pod_template_dict": SIDECARS})
    _, [pod] = with_secret([validate(obj) for obj in task.render_manifests()])
    spec = pod["spec"]
    others = [c for c in [*spec["initContainers"], *spec["containers"]] if c["name"] != "base"]
    assert {c["name"] for c in others} == {"warmup", "metrics", "airflow-xcom-sidecar"}
    for container in others:
        assert _visible(container) == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}], container["name"]
    assert _visible(main_container(pod)) == []  # the device plugin sets it for the container that has the GPU


def test_the_pod_template_file_read_on_the_worker_gets_void_too(tmp_path):
    """A template read only when the task runs passes the same final check."""
    template = tmp_path / "pod.yaml"
    template.write_text(yaml.safe_dump(SIDECARS))
    task = _task(gpu_count=1, backend_options={"namespace": "ml", "pod_template_file": str(template)})
    _, [pod] = with_secret([validate(obj) for obj in task.render_manifests()])
    [warmup] = pod["spec"]["initContainers"]
    assert _visible(warmup) == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]  # its own "all" replaced


def test_the_indexed_jobs_pods_get_void_in_every_container_without_a_gpu():
    with DAG("boundary_job", schedule=None):
        task = AccelerateOperator(
            task_id="two_nodes", python_callable=work, backend="kubernetes", num_machines=2, requirements=["six"],
            resources=ResourceSettings(accelerator="A100:4"), backend_options={"namespace": "ml"},
        )  # fmt: skip
    _, [_, job] = with_secret([validate(obj) for obj in task.render_manifests()])
    spec = job["spec"]["template"]["spec"]
    [install] = spec["initContainers"]  # requirements are installed in the CUDA image, which needs no GPU for it
    assert _visible(install) == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    assert _visible(spec["containers"][0]) == []


def test_void_replaces_a_value_or_a_reference_in_place_and_keeps_gpu_and_claim_containers():
    pod = {
        "kind": "Pod",
        "spec": {
            "initContainers": [{"name": "i", "env": [{"name": "A", "value": "1"}, {"name": "NVIDIA_VISIBLE_DEVICES",
                                "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}, {"name": "B", "value": "2"}]}],
            "containers": [
                {"name": "gpu", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}, "env": [{"name": "X", "value": "1"}]},
                {"name": "claim", "resources": {"claims": [{"name": "gpu"}]}},
                {"name": "amd", "resources": {"limits": {"amd.com/gpu": "1"}}},
                {"name": "twice", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}] * 2},
            ],
        },
    }  # fmt: skip
    done = final(pod, "privileged", "a pod", {})
    [init] = done["spec"]["initContainers"]
    assert [v["name"] for v in init["env"]] == ["A", "NVIDIA_VISIBLE_DEVICES", "B"]
    assert init["env"][1] == {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
    gpu, claim, amd, twice = done["spec"]["containers"]
    assert (gpu.get("env"), claim.get("env")) == ([{"name": "X", "value": "1"}], None)  # their devices are theirs
    assert _visible(amd) == _visible(twice) == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    assert pod["spec"]["containers"][3]["env"][0]["value"] == "all"  # a copy: the caller's object is unchanged


# ---------------------------------------------------------------------------------------------- rule P3
@pytest.mark.parametrize(
    ("option", "value", "path"),
    [
        ("namespace", "kube-system", "metadata.namespace"),
        ("service_account_name", "cluster-admin-sa", "spec.serviceAccountName"),
        ("runtime_class_name", "nvidia-privileged", "spec.runtimeClassName"),
        ("priority_class_name", "system-cluster-critical", "spec.priorityClassName"),
        ("kueue_queue", "other-team", "metadata.labels['kueue.x-k8s.io/queue-name']"),
        ("kueue_priority_class", "top", "metadata.labels['kueue.x-k8s.io/priority-class']"),
        ("labels", {"kueue.x-k8s.io/queue-name": "other-team"}, "metadata.labels['kueue.x-k8s.io/queue-name']"),
        ("pod_template_dict", {"spec": {"serviceAccount": "cluster-admin-sa"}}, "spec.serviceAccount"),
        ("pod_template_dict", {"metadata": {"namespace": "kube-system"}}, "metadata.namespace"),
    ],
)
def test_what_the_allow_list_does_not_hold_is_refused_at_parse_naming_the_option(option, value, path, monkeypatch):
    monkeypatch.delenv("AIRFLOW__GPU_POLICY__ALLOWED_OBJECTS")  # the default: nothing beyond the deployment's
    # the deployment's queue, its cluster connection's (a priority class needs one)
    monkeypatch.setenv(
        "AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps({"conn_type": "kubernetes", "extra": {"kueue_queue": "team-a"}})
    )
    with pytest.raises(PolicyError, match=rf"backend_options\['{option}'\].*allowed_objects") as err:
        _task(gpu_count=1, backend_options={option: value})
    assert path in str(err.value) and err.value.option == "allowed_objects"


def test_listed_names_and_a_wildcard_pass_and_the_deployments_own_need_no_listing(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_OBJECTS", "namespace=ml, service_account=*")
    extra = {"conn_type": "kubernetes", "extra": {"kueue_queue": "research"}}  # the deployment's queue: allowed
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(extra))
    options = {"namespace": "ml", "service_account_name": "anyone"}
    _, [pod] = with_secret([validate(obj) for obj in _task(gpu_count=1, backend_options=options).render_manifests()])
    assert (pod["metadata"]["namespace"], pod["spec"]["serviceAccountName"]) == ("ml", "anyone")
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"
    with pytest.raises(PolicyError, match="allowed_objects"):
        _task(gpu_count=1, backend_options={"namespace": "ml-other"})
    with pytest.raises(PolicyError, match="allowed_objects"):  # a task that names it is judged at parse, unlisted
        _task(gpu_count=1, backend_options={"kueue_queue": "research"})


def test_a_pod_template_file_that_names_kube_system_is_refused_when_the_pod_is_built(tmp_path, monkeypatch):
    monkeypatch.delenv("AIRFLOW__GPU_POLICY__ALLOWED_OBJECTS")
    template = tmp_path / "pod.yaml"
    template.write_text(yaml.safe_dump({"metadata": {"namespace": "kube-system"}, "spec": {"runtimeClassName": "x"}}))
    task = _task(gpu_count=1, backend_options={"pod_template_file": str(template)})  # read only when the task runs
    with pytest.raises(PodSecurityError, match=r"metadata\.namespace='kube-system'.*spec\.runtimeClassName='x'"):
        task.render_manifests()


def test_the_worker_judges_the_final_pod_with_its_own_list_and_the_connections_namespace(monkeypatch):
    """A namespace the connection gives is the deployment's own; a listed one passes; any other is refused."""
    from airflow_gpu_provider.backends import BACKENDS
    from airflow_gpu_provider.settings import ImageSettings
    from airflow_gpu_provider.task.envelope import Envelope
    from airflow_gpu_provider.task.request import TaskRequest

    monkeypatch.setenv("AIRFLOW_CONN_GKE", '{"conn_type": "kubernetes", "extra": {"namespace": "from-connection"}}')
    labels = {"dag_id": "d", "task_id": "train", "run_id": "r", "try_number": "1", "map_index": "-1"}
    request = TaskRequest(ResourceSettings(gpu_count=1), ImageSettings(), Envelope.run(["true"]), "fail", labels)
    backend = BACKENDS["kubernetes"].create({"kubernetes_conn_id": "gke"})
    [_, pod] = backend.render(request, GpuConfig.read(allowed_objects=""), None)
    assert pod["metadata"]["namespace"] == "from-connection"
    backend = BACKENDS["kubernetes"].create({"kubernetes_conn_id": "gke", "namespace": "ml"})  # listed at parse
    with pytest.raises(GpuTaskError, match=r"metadata\.namespace='ml'"):  # not by this worker
        backend.render(request, GpuConfig.read(allowed_objects="namespace=ml-training"), None)


def test_the_list_is_parsed_with_clear_errors_and_every_kind_has_its_place():
    assert set(REFERENCES) == set(POD_OBJECT_KINDS)
    conf = GpuConfig.read(allowed_objects=" namespace=ml,namespace=ml-b , runtime_class=nvidia, kueue_queue=q")
    allowed = Policy.of(conf).objects
    assert (
        allowed["namespace"] == {"ml", "ml-b"}
        and allowed["kueue_queue"] == {"q"}
        and allowed["priority_class"] == set()
    )
    for bad in ("namespaces=ml", "namespace=", "namespace=Kube_System", "ml"):
        with pytest.raises(ValueError, match=r"allowed_objects: .* is not KIND=NAME"):
            Policy.of(GpuConfig.read(allowed_objects=bad))
    job = {"kind": "Job", "metadata": {"namespace": "ml"}, "spec": {"template": {"spec": {"serviceAccountName": "x"}}}}
    assert [v.path for v in unlisted(job, Policy.of(conf).objects)] == ["spec.template.spec.serviceAccountName"]


# ---------------------------------------------------------------------------------------------- KubernetesExecutor
USER_TEMPLATE = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "placeholder"},
    "spec": {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 50000, "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [{**CUDA_SIDECAR, "name": "git-sync-init"}],
        "containers": [{"name": "base", "image": "apache/airflow:3.3.2", "securityContext": CONTEXT}, CUDA_SIDECAR],
        "restartPolicy": "Never",
    },
}


def _worker_pod(task, template: Path) -> dict:
    """What KubernetesExecutor submits for the task (the cncf provider's construct_pod), as an API dict."""
    pod = PodGenerator.construct_pod(
        dag_id="boundary_executor", task_id=task.task_id, pod_id="boundary-train-1a2b3c", try_number=1,
        kube_image="apache/airflow:3.3.2", date=None, args=["airflow", "tasks", "run"],
        pod_override_object=PodGenerator.from_obj(task.executor_config),
        base_worker_pod=PodGenerator.deserialize_model_file(str(template)), namespace="airflow",
        scheduler_job_id="7", run_id="manual__1",
    )  # fmt: skip
    return ApiClient().sanitize_for_serialization(pod)


def test_a_kubernetes_executor_worker_pods_sidecars_get_void_and_its_names_are_judged(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "KubernetesExecutor")
    template = tmp_path / "worker.yaml"
    template.write_text(yaml.safe_dump(USER_TEMPLATE))
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE", str(template))
    own = {"name": "fetch", "image": "busybox", "securityContext": CONTEXT}  # the task's own init container
    override = {"spec": {"initContainers": [own]}}
    with DAG("boundary_executor", schedule=None):
        task = GpuStepOperator(
            task_id="train", python_callable=work, backend="executor", gpu_count=1,
            executor_config={"pod_override": override},
        )  # fmt: skip
    pod = validate(_worker_pod(task, template))
    spec = pod["spec"]
    names = [c["name"] for c in [*spec["initContainers"], *spec["containers"]]]
    assert names == ["git-sync-init", "fetch", "base", "metrics"]
    for container in [*spec["initContainers"], *spec["containers"][1:]]:  # the template's and the task's own
        assert _visible(container)[-1:] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}], container["name"]
    assert _visible(main_container(pod)) == [] and "nvidia.com/gpu" in main_container(pod)["resources"]["limits"]
    for override, path in (
        ({"spec": {"serviceAccountName": "cluster-admin-sa"}}, r"spec\.serviceAccountName='cluster-admin-sa'"),
        ({"metadata": {"namespace": "kube-system"}}, r"metadata\.namespace='kube-system'"),  # it would move the pod
    ):
        error = rf"executor_config\['pod_override'\].*{path}.*allowed_objects"
        with pytest.raises(InvalidSettingError, match=error), DAG("boundary_executor_names", schedule=None):
            GpuStepOperator(
                task_id="train", python_callable=work, backend="executor", gpu_count=1,
                executor_config={"pod_override": override},
            )  # fmt: skip
