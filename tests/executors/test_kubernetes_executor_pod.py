"""KubernetesExecutor: the worker pod of a GPU task, built the way the executor builds it.

No cluster exists here, so the pod is made by the cncf provider's own ``PodGenerator.construct_pod`` (the executor's
reconcile of the worker pod template, its dynamic pod and the task's ``pod_override``), for the provider's shipped
template and for a user template, from a task that went through DAG serialisation. Each pod is validated against the
official schemas (kubernetes-validate, strict) and the restricted Pod Security Standards profile.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from airflow.providers.cncf.kubernetes import pod_generator
from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
from backends.kubernetes.k8s_manifests import main_container, validate
from conftest import REPO
from helpers import load_dag
from kubernetes.client import ApiClient, V1Container, V1EnvVar, V1ObjectMeta, V1Pod, V1PodSpec, V1ResourceRequirements

from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.backends.executor.placement import PLACED_KEY
from airflow_gpu_provider.exceptions import InvalidSettingError

SHIPPED_TEMPLATE = Path(pod_generator.__file__).parent / "kubernetes_executor_templates" / "basic_template.yaml"
USER_TEMPLATE = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "placeholder", "labels": {"team": "ml"}},
    "spec": {
        "nodeSelector": {"topology.kubernetes.io/zone": "eu-west-1a"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        "securityContext": {"runAsUser": 50000, "fsGroup": 0},
        "containers": [
            {
                "name": "base",
                "image": "apache/airflow:3.3.2",
                "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
                "volumeMounts": [{"name": "logs", "mountPath": "/opt/airflow/logs"}],
            }
        ],
        "volumes": [{"name": "logs", "emptyDir": {}}],
        "restartPolicy": "Never",
    },
}


@pytest.fixture
def kubernetes_executor(monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "KubernetesExecutor")
    monkeypatch.delenv("AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE", raising=False)


@pytest.fixture
def user_template(tmp_path, monkeypatch, kubernetes_executor) -> Path:
    path = tmp_path / "pod_template.yaml"
    path.write_text(yaml.safe_dump(USER_TEMPLATE))
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE", str(path))
    return path


def worker_pod(task, template: Path) -> dict:
    """What KubernetesExecutor submits for this task: the cncf provider's construct_pod, as an API dict."""
    pod = PodGenerator.construct_pod(
        dag_id="executor_gpu",
        task_id=task.task_id,
        pod_id="executor-gpu-train-1a2b3c",
        try_number=1,
        kube_image="apache/airflow:3.3.2",
        date=None,
        args=["airflow", "tasks", "run", "executor_gpu", task.task_id, "manual__1", "--local"],
        pod_override_object=PodGenerator.from_obj(task.executor_config),
        base_worker_pod=PodGenerator.deserialize_model_file(str(template)),
        namespace="airflow",
        scheduler_job_id="7",
        run_id="manual__1",
    )
    return ApiClient().sanitize_for_serialization(pod)


def gpu_task(**kwargs) -> GpuStepOperator:
    return GpuStepOperator(task_id="train", command=["python3", "-c", "print(1)"], backend="executor", **kwargs)


def _serialized(dag, task_id):
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.from_dict(DagSerialization.to_dict(dag)).get_task(task_id)


def test_the_dag_files_gpu_task_gets_a_gpu_pod_through_serialisation(kubernetes_executor, airflow_home):
    dag = load_dag(REPO / "tests" / "dags" / "executor_dags.py", "executor_gpu")
    task = _serialized(dag, "train")
    assert isinstance(task.executor_config["pod_override"], V1Pod)
    pod = validate(worker_pod(task, SHIPPED_TEMPLATE))
    base = main_container(pod)
    assert base["resources"]["limits"] == {"nvidia.com/gpu": "1"} == base["resources"]["requests"]
    assert base["image"] == "apache/airflow:3.3.2"  # the executor's image: no nested container
    assert base["args"][:3] == ["airflow", "tasks", "run"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in base["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in pod["spec"]["volumes"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    # the shipped template's own pieces survive the executor's merge
    assert {"name": "airflow-logs", "mountPath": "/opt/airflow/logs"} in base["volumeMounts"]
    assert pod["spec"]["serviceAccountName"] == "airflow-worker"
    # no template readable at parse: the restricted profile's default user
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    # the plain task is not touched
    assert _serialized(dag, "prepare").executor_config in ({}, None)


def test_a_user_template_is_merged_by_the_scheduling_rules(user_template):
    task = gpu_task(gpu_count=2, accelerator="H200", cpu_count=8, memory="64Gi", shm_size="16Gi")
    pod = validate(worker_pod(task, user_template))
    spec, base = pod["spec"], main_container(pod)
    assert base["resources"]["limits"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"}
    assert base["resources"]["requests"] == base["resources"]["limits"]  # Guaranteed QoS, GPUs request = limit
    assert spec["nodeSelector"] == {
        "topology.kubernetes.io/zone": "eu-west-1a",
        "nvidia.com/gpu.product": "NVIDIA-H200",
    }
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
    ]
    assert spec["securityContext"]["runAsUser"] == 50000 == base["securityContext"]["runAsUser"]  # the image's user
    assert spec["securityContext"]["fsGroup"] == 50000
    assert {"name": "logs", "mountPath": "/opt/airflow/logs"} in base["volumeMounts"]
    assert {"name": "logs", "emptyDir": {}} in spec["volumes"]
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["annotations"]["airflow-gpu-provider/resources"].startswith("2x nvidia H200")


def test_the_template_keeps_cpu_and_memory_the_task_leaves_unset(user_template):
    pod = validate(worker_pod(gpu_task(gpu_count=1), user_template))
    resources = main_container(pod)["resources"]
    assert resources["requests"] == {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"}
    assert resources["limits"] == {"memory": "2Gi", "nvidia.com/gpu": "1"}


def test_a_model_with_several_labels_is_a_required_affinity_and_mig_is_its_own_resource(kubernetes_executor):
    pod = validate(worker_pod(gpu_task(gpu_count=1, accelerator="A100"), SHIPPED_TEMPLATE))
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expression = terms["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert expression["key"] == "nvidia.com/gpu.product" and "NVIDIA-A100-SXM4-80GB" in expression["values"]
    mig = validate(worker_pod(gpu_task(gpu_count=2, mig_profile="1g.10gb"), SHIPPED_TEMPLATE))
    assert main_container(mig)["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "2"}


def test_kubernetes_options_shape_the_pod(kubernetes_executor):
    options = {"kubernetes": {"label_scheme": "gke", "priority_class_name": "gpu-high", "labels": {"cost": "ml"}}}
    pod = validate(worker_pod(gpu_task(gpu_count=1, accelerator="L4", backend_options=options), SHIPPED_TEMPLATE))
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert pod["spec"]["priorityClassName"] == "gpu-high"
    assert pod["metadata"]["labels"]["cost"] == "ml"


def test_a_users_pod_override_is_merged_not_replaced(kubernetes_executor):
    own = V1Pod(
        metadata=V1ObjectMeta(annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}),
        spec=V1PodSpec(
            containers=[
                V1Container(
                    name="base",
                    env=[V1EnvVar(name="HF_HOME", value="/cache")],
                    resources=V1ResourceRequirements(limits={"ephemeral-storage": "20Gi"}),
                )
            ]
        ),
    )
    task = gpu_task(gpu_count=1, executor_config={"pod_override": own})
    assert task.executor_config[PLACED_KEY] is True
    pod = validate(worker_pod(task, SHIPPED_TEMPLATE))
    base = main_container(pod)
    assert base["resources"]["limits"] == {"ephemeral-storage": "20Gi", "nvidia.com/gpu": "1"}
    assert {"name": "HF_HOME", "value": "/cache"} in base["env"]
    assert pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"


def test_a_conflicting_pod_override_is_an_error_naming_both_values(kubernetes_executor):
    own = V1Pod(
        spec=V1PodSpec(
            containers=[V1Container(name="base", resources=V1ResourceRequirements(limits={"nvidia.com/gpu": "4"}))]
        )
    )
    with pytest.raises(InvalidSettingError, match=r"pod_override.*'4'.*need.*'1'") as err:
        gpu_task(gpu_count=1, executor_config={"pod_override": own})
    assert err.value.field == "executor_config['pod_override']"
    selector = V1Pod(
        spec=V1PodSpec(containers=[V1Container(name="base")], node_selector={"nvidia.com/gpu.product": "Tesla-T4"})
    )
    with pytest.raises(InvalidSettingError, match="Tesla-T4.*NVIDIA-H200"):
        gpu_task(gpu_count=1, accelerator="H200", executor_config={"pod_override": selector})


def test_a_pod_override_that_breaks_the_restricted_profile_is_refused(kubernetes_executor):
    own = {"spec": {"containers": [{"name": "base", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}}
    with pytest.raises(InvalidSettingError, match="restricted Pod Security Standards level") as err:
        gpu_task(gpu_count=1, executor_config={"pod_override": own})
    assert "SYS_ADMIN" in str(err.value)
    root = {"spec": {"containers": [{"name": "base", "securityContext": {"runAsUser": 0}}]}}
    with pytest.raises(InvalidSettingError, match="runAsUser=0.*need.*runAsUser=1000"):
        gpu_task(gpu_count=1, executor_config={"pod_override": root})


def test_an_admins_claim_template_gives_the_worker_pod_its_gpus_by_dra(kubernetes_executor):
    """``dra_claim_template``: the pod names the admin's ResourceClaimTemplate (a pod_override creates nothing)."""
    options = {"kubernetes": {"dra_claim_template": "team-a-h100"}}
    task = gpu_task(gpu_count=1, accelerator="H100", backend_options=options)
    pod = validate(worker_pod(task, SHIPPED_TEMPLATE))
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "team-a-h100"}]
    base = main_container(pod)
    assert base["resources"]["claims"] == [{"name": "gpu"}]
    assert "nvidia.com/gpu" not in (base["resources"].get("limits") or {})
    assert not pod["spec"].get("nodeSelector") and "affinity" not in pod["spec"]  # the template picks the model
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_a_claim_template_with_a_pod_override_that_holds_claims_is_refused_at_parse(kubernetes_executor):
    own = {
        "spec": {"resourceClaims": [{"name": "mine", "resourceClaimName": "shared"}], "containers": [{"name": "base"}]}
    }
    with pytest.raises(InvalidSettingError) as raised:
        gpu_task(
            gpu_count=1,
            backend_options={"kubernetes": {"dra_claim_template": "team-a-h100"}},
            executor_config={"pod_override": own},
        )
    message = str(raised.value)
    assert "executor_config['pod_override']" in message and "holds resource claims" in message
    with pytest.raises(InvalidSettingError, match="not a ResourceClaimTemplate name"):
        gpu_task(gpu_count=1, backend_options={"kubernetes": {"dra_claim_template": "Team A"}})
