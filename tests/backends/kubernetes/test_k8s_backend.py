"""KubernetesBackend.plan(): what the pod carries (runtime, envelope, environment, requirements, fallbacks), and
the checks at DAG parse time."""

from __future__ import annotations

import base64
import zlib

import pytest
from k8s_manifests import env, envelope_of, main_container, plan_and_render

from airflow_gpu_provider.backends.kubernetes.container import LAUNCHER
from airflow_gpu_provider.backends.kubernetes.requirements import DEPS_DIR, INIT_CONTAINER
from airflow_gpu_provider.exceptions import GpuTaskError, InvalidSettingError
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.runtime_zip import archive


def test_main_container_runs_the_shipped_runtime_and_writes_to_the_xcom_sidecar():
    plan, [pod] = plan_and_render(ResourceSettings(gpu_count=1), envelope=Envelope.run(["nvidia-smi"]))
    base = main_container(pod)
    assert base["command"] == ["python3", "-c", LAUNCHER]
    assert base["args"] == ["env:AIRFLOW_GPU_ENVELOPE", "/airflow/xcom/return.json"]
    variables = env(base)
    assert zlib.decompress(base64.b64decode(variables["AIRFLOW_GPU_BOOTSTRAP"])) == archive()  # the runtime.pyz
    envelope = envelope_of(plan)  # in the task's Secret: the variable is a reference (k8s_manifests.with_secret)
    assert envelope["command"] == ["nvidia-smi"]
    assert envelope["summary"] == {
        "backend": "kubernetes",
        "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        "requirements_hash": "none",
        "resources": "1x nvidia GPU",
        "gpus": None,
        "effective": {**ResourceSettings(gpu_count=1).to_dict(), "cpu_fallback": False},
    }
    sidecars = [c["name"] for c in pod["spec"]["containers"]]
    assert sidecars == ["base", "airflow-xcom-sidecar"]
    assert {"name": "xcom", "mountPath": "/airflow/xcom"} in base["volumeMounts"]
    assert pod["spec"]["restartPolicy"] == "Never"


def test_environment_threads_and_gpu_visibility():
    _, [pod] = plan_and_render(ResourceSettings(cpu_count=3.5), ImageSettings(environment={"HF_HOME": "/cache"}))
    variables = env(main_container(pod))
    assert variables["OMP_NUM_THREADS"] == variables["MKL_NUM_THREADS"] == "4"
    assert variables["HF_HOME"] == "/cache"
    assert variables["PYTHONUNBUFFERED"] == "1"
    assert variables["NVIDIA_VISIBLE_DEVICES"] == "void"  # a CPU pod must not see the node's GPUs
    _, [pod] = plan_and_render(ResourceSettings(gpu_count=1))
    assert "NVIDIA_VISIBLE_DEVICES" not in env(main_container(pod))  # the device plugin sets it


def test_requirements_are_installed_by_an_init_container_into_a_shared_empty_dir():
    image = ImageSettings(
        parent_image="nvcr.io/nvidia/pytorch:24.10-py3",
        requirements=["transformers==4.46.0", "datasets>=3"],
        index_url="https://pypi.example.com/simple",
    )
    _, [pod] = plan_and_render(ResourceSettings(gpu_count=1, cpu_count=2, memory="8Gi"), image)
    [init] = pod["spec"]["initContainers"]
    assert init["name"] == INIT_CONTAINER
    assert init["image"] == "nvcr.io/nvidia/pytorch:24.10-py3"  # same Python, same preinstalled packages
    assert init["command"] == ["python3", "-c", LAUNCHER]  # the runtime's archive, as the main container's
    assert init["args"] == [
        "install",
        DEPS_DIR,
        "uv",
        "--index-url",
        "https://pypi.example.com/simple",
        "--",
        "transformers==4.46.0",
        "datasets>=3",
    ]
    assert init["resources"]["limits"] == {"cpu": "2", "memory": "8Gi"}  # never a GPU
    assert init["securityContext"]["runAsNonRoot"] is True  # the restricted profile, as every container
    base = main_container(pod)
    assert base["image"] == "nvcr.io/nvidia/pytorch:24.10-py3"
    assert env(base)["PYTHONPATH"] == DEPS_DIR
    assert {"name": "gpu-deps", "mountPath": DEPS_DIR, "readOnly": True} in base["volumeMounts"]
    assert {"name": "gpu-deps", "emptyDir": {}} in pod["spec"]["volumes"]


def test_image_mode_runs_the_derived_image_and_installs_nothing():
    image = ImageSettings(requirements=["transformers==4.46.0"])
    options = {"requirements_mode": "image", "derived_image": "registry.example.com/ml/train:3f2a9c"}
    _, [pod] = plan_and_render(ResourceSettings(gpu_count=1), image, options)
    assert not pod["spec"].get("initContainers")
    assert main_container(pod)["image"] == "registry.example.com/ml/train:3f2a9c"
    assert "PYTHONPATH" not in env(main_container(pod))


def test_installer_image_replaces_the_init_container_image_only():
    image = ImageSettings(requirements=["rich"], parent_image="nvcr.io/nvidia/pytorch:24.10-py3")
    _, [pod] = plan_and_render(image=image, options={"installer_image": "ghcr.io/astral-sh/uv:python3.12"})
    assert pod["spec"]["initContainers"][0]["image"] == "ghcr.io/astral-sh/uv:python3.12"
    assert main_container(pod)["image"] == "nvcr.io/nvidia/pytorch:24.10-py3"


@pytest.mark.parametrize(("policy", "timeout"), [("fail", 300.0), ("cpu", 300.0), ("wait", 86400.0)])
def test_pending_timeout_defaults_by_policy_and_can_be_set(policy, timeout):
    plan, _ = plan_and_render(ResourceSettings(gpu_count=1), policy=policy)
    assert plan.pending_timeout == timeout
    plan, _ = plan_and_render(ResourceSettings(gpu_count=1), policy=policy, options={"pending_timeout": 42})
    assert plan.pending_timeout == 42


def test_cpu_policy_plans_a_cpu_only_fallback_pod():
    plan, _ = plan_and_render(ResourceSettings(accelerator="A100:2", cpu_count=4), policy="cpu")
    assert plan.cpu_fallback is not None
    assert plan.cpu_fallback.resources == {"requests": {"cpu": "4"}, "limits": {"cpu": "4"}}
    assert plan.cpu_fallback.tolerations == []
    assert plan.cpu_fallback.affinity == {}
    assert plan.cpu_fallback.environment["NVIDIA_VISIBLE_DEVICES"] == "void"
    envelope = envelope_of(plan.cpu_fallback)
    assert envelope["summary"]["resources"] == "2x nvidia A100, 4 CPUs -> CPU fallback"
    assert envelope["summary"]["gpus"] == []  # no need to ask the driver: the fallback pod has no GPU
    assert plan_and_render(ResourceSettings(gpu_count=1), policy="fail")[0].cpu_fallback is None


def test_arguments_too_large_for_an_environment_variable_are_a_clear_error():
    envelope = Envelope.run(["python3", "-c", "x" * 200_000])
    with pytest.raises(GpuTaskError, match="Pass large data by reference"):
        plan_and_render(envelope=envelope)


# ------------------------------------------------------------------ DAG parse time
def _task(**kwargs):
    from airflow_gpu_provider import GpuStepOperator

    return GpuStepOperator(task_id="t", command=["true"], backend="kubernetes", **kwargs)


def test_gpu_count_all_fails_at_parse_time_on_kubernetes():
    with pytest.raises(InvalidSettingError, match="'all' works only on the local and docker and executor backends"):
        _task(gpu_count="all")


def test_unknown_accelerator_for_the_scheme_fails_at_parse_time():
    with pytest.raises(InvalidSettingError, match="label scheme 'eks'"):
        _task(accelerator="MI300X", backend_options={"label_scheme": "eks"})


def test_bad_backend_option_fails_at_parse_time():
    with pytest.raises(InvalidSettingError, match="backend_options\\['namespace'\\]"):
        _task(backend_options={"namespace": "Not A Label"})


def test_templated_resources_are_checked_when_rendered():
    task = _task(gpu_count="{{ params.gpus }}")
    assert task.resource_overrides == {"gpu_count": "{{ params.gpus }}"}


def test_pods_meet_the_restricted_profile_by_default_and_baseline_is_an_opt_out(monkeypatch):
    image = ImageSettings(requirements=["six"])
    _, [pod] = plan_and_render(ResourceSettings(gpu_count=1), image)  # validate() checks every container
    names = [c["name"] for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]]
    assert names == ["install-requirements", "base", "airflow-xcom-sidecar"]
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    _, [pod] = plan_and_render(ResourceSettings(gpu_count=1), image, {"run_as_user": 2000})
    assert {c["securityContext"]["runAsUser"] for c in pod["spec"]["containers"]} == {2000}
    with pytest.raises(GpuTaskError, match=r"pod_security'\]='baseline' is refused.*min_pod_security"):
        plan_and_render(ResourceSettings(gpu_count=1), image, {"pod_security": "baseline"})  # the admin's default
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__MIN_POD_SECURITY", "baseline")
    _, [pod] = plan_and_render(ResourceSettings(gpu_count=1), image, {"pod_security": "baseline"})
    assert main_container(pod)["securityContext"] == {"privileged": False, "allowPrivilegeEscalation": False}
    assert "securityContext" not in pod["spec"] or not pod["spec"]["securityContext"]


def test_the_providers_device_isolation_wins_over_the_tasks_environment():
    image = ImageSettings(environment={"NVIDIA_VISIBLE_DEVICES": "all", "OMP_NUM_THREADS": "7"})
    _, [pod] = plan_and_render(ResourceSettings(cpu_count=2), image)
    variables = env(main_container(pod))
    assert variables["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert variables["OMP_NUM_THREADS"] == "7"  # a default the task may change
