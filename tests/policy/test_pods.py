"""The pod-security policy (policy/pods.py): one check over the whole pod, at DAG parse and before submission.

M1 (issue 19): "restricted by default" checked one securityContext, so a ``pod_template_dict`` (Kubernetes backend)
or a ``pod_override`` (executor backend) brought back what the level forbids in every other part of the pod. Each
bypass is refused at parse here, naming the field and the path; a ``pod_template_file`` with it is refused when the
pod is built (render here; the run path in tests/backends/kubernetes/test_k8s_pod_security.py). The provider's own
pods meet the restricted level, checked by the policy and by the suite's own profile check (k8s_manifests).
"""

from __future__ import annotations

import copy
import re

import pytest
import yaml
from k8s_manifests import plan_and_render, validate

from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.exceptions import GpuTaskError, InvalidSettingError
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings

SIDECAR = {"name": "sidecar", "image": "busybox"}
APPARMOR = "container.apparmor.security.beta.kubernetes.io/base"
# name -> (a pod template or pod_override that brings the bypass back, the path the refusal must name)
BYPASSES = {
    "hostPath /": ({"spec": {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}, "spec.volumes[0].hostPath"),
    "hostPID": ({"spec": {"hostPID": True}}, "spec.hostPID"),
    "hostNetwork": ({"spec": {"hostNetwork": True}}, "spec.hostNetwork"),
    "hostIPC": ({"spec": {"hostIPC": True}}, "spec.hostIPC"),
    "privileged root sidecar": (
        {"spec": {"containers": [{"name": "base"}, {**SIDECAR, "securityContext": {"privileged": True, "runAsUser": 0}}]}},
        "spec.containers[1].securityContext.privileged",
    ),
    "privileged init container": (
        {"spec": {"initContainers": [{**SIDECAR, "name": "setup", "securityContext": {"privileged": True}}]}},
        "spec.initContainers[0].securityContext.privileged",
    ),
    "ephemeral container": (
        {"spec": {"ephemeralContainers": [{**SIDECAR, "name": "debug", "securityContext": {"privileged": True}}]}},
        "spec.ephemeralContainers[0].securityContext.privileged",
    ),
    "unsafe sysctl": (
        {"spec": {"securityContext": {"sysctls": [{"name": "kernel.core_pattern", "value": "|/tmp/x"}]}}},
        "spec.securityContext.sysctls[0].name",
    ),
    "AppArmor Unconfined (field)": (
        {"spec": {"containers": [{"name": "base"}, {**SIDECAR, "securityContext": {"appArmorProfile": {"type": "Unconfined"}}}]}},
        "spec.containers[1].securityContext.appArmorProfile.type",
    ),
    "AppArmor unconfined (annotation)": (
        {"metadata": {"annotations": {APPARMOR: "unconfined"}}, "spec": {}},
        f"metadata.annotations['{APPARMOR}']",
    ),
    "hostPort": (
        {"spec": {"containers": [{"name": "base", "ports": [{"containerPort": 8080, "hostPort": 8080}]}]}},
        "spec.containers[0].ports[0].hostPort",
    ),
    "added capability": (
        {"spec": {"containers": [{"name": "base"}, {**SIDECAR, "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}},
        "spec.containers[1].securityContext.capabilities.add[0]",
    ),
}  # fmt: skip
#: Bypasses in the pod's own security context: KubernetesPodOperator replaces a template's with the provider's
#: restricted one, so only at a weaker level does the template's reach the pod.
POD_CONTEXT = {"unsafe sysctl"}


def kubernetes_task(**kwargs) -> GpuStepOperator:
    options = {"namespace": "ml", **kwargs.pop("backend_options", {})}
    return GpuStepOperator(
        task_id="train", command=["true"], backend="kubernetes", gpu_count=1, backend_options=options, **kwargs
    )


@pytest.fixture
def kubernetes_executor(monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "KubernetesExecutor")
    monkeypatch.delenv("AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE", raising=False)


def _refusal_names(err: InvalidSettingError, field: str, path: str) -> None:
    message = str(err)
    assert err.field == field, message
    assert path in message, message
    assert "[gpu_policy] min_pod_security" in message, message
    assert getattr(err, "option", None) == "min_pod_security", message


# ---------------------------------------------------------------------------------------------- M1, at DAG parse
@pytest.mark.parametrize("level", ["restricted", "baseline"])
@pytest.mark.parametrize("bypass", sorted(BYPASSES))
def test_each_bypass_in_a_pod_template_dict_is_refused_at_parse_naming_the_field(bypass, level, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__MIN_POD_SECURITY", level)
    template, path = BYPASSES[bypass]
    with pytest.raises(InvalidSettingError) as err:
        kubernetes_task(backend_options={"pod_template_dict": copy.deepcopy(template), "pod_security": level})
    _refusal_names(err.value, "backend_options['pod_template_dict']", path)


@pytest.mark.parametrize("bypass", sorted(BYPASSES))
def test_each_bypass_in_a_pod_override_is_refused_at_parse_naming_the_field(bypass, kubernetes_executor):
    template, path = BYPASSES[bypass]
    with pytest.raises(InvalidSettingError) as err:
        GpuStepOperator(
            task_id="train", command=["true"], backend="executor", gpu_count=1,
            executor_config={"pod_override": copy.deepcopy(template)},
        )  # fmt: skip
    _refusal_names(err.value, "executor_config['pod_override']", path)


@pytest.mark.parametrize("bypass", sorted(BYPASSES))
def test_each_bypass_in_the_tasks_own_worker_template_is_refused_at_parse(bypass, kubernetes_executor, tmp_path):
    template, path = BYPASSES[bypass]
    worker = tmp_path / "worker.yaml"
    worker.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", **template}))
    with pytest.raises(InvalidSettingError) as err:
        GpuStepOperator(
            task_id="train", command=["true"], backend="executor", gpu_count=1,
            executor_config={"pod_template_file": str(worker)},
        )  # fmt: skip
    _refusal_names(err.value, "executor_config['pod_template_file']", path)


def test_a_pod_override_marked_as_placed_by_its_author_is_still_judged(kubernetes_executor):
    """The mark that spares a decorated task a second merge is the DAG author's to write: it spares no check."""
    from airflow_gpu_provider.backends.executor.placement import PLACED_KEY

    template, path = BYPASSES["hostPath /"]
    with pytest.raises(InvalidSettingError) as err:
        GpuStepOperator(
            task_id="train", command=["true"], backend="executor", gpu_count=1,
            executor_config={"pod_override": copy.deepcopy(template), PLACED_KEY: True},
        )  # fmt: skip
    _refusal_names(err.value, "executor_config['pod_override']", path)


def test_a_worker_template_the_task_names_must_be_readable_where_the_dag_is_parsed(kubernetes_executor, tmp_path):
    with pytest.raises(InvalidSettingError, match="not readable where the DAG is parsed") as err:
        GpuStepOperator(
            task_id="train", command=["true"], backend="executor", gpu_count=1,
            executor_config={"pod_template_file": str(tmp_path / "elsewhere.yaml")},
        )  # fmt: skip
    assert err.value.field == "executor_config['pod_template_file']"


@pytest.mark.parametrize(
    ("context", "path"),
    [
        ({"privileged": True}, "privileged"),
        ({"capabilities": {"add": ["SYS_ADMIN"]}}, "capabilities.add[0]"),
        ({"seccompProfile": {"type": "Unconfined"}}, "seccompProfile.type"),
        ({"appArmorProfile": {"type": "Unconfined"}}, "appArmorProfile.type"),
        ({"seLinuxOptions": {"type": "spc_t"}}, "seLinuxOptions.type"),
        ({"procMount": "Unmasked"}, "procMount"),
        ({"windowsOptions": {"hostProcess": True}}, "windowsOptions.hostProcess"),
        ({"privileged": "false"}, "privileged"),  # not a boolean: the client would make it True
    ],
)
def test_container_security_context_is_judged_at_baseline_too(context, path, monkeypatch):
    """Before: only the restricted profile was checked; at baseline ``privileged=True`` went through."""
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__MIN_POD_SECURITY", "baseline")
    with pytest.raises(InvalidSettingError) as err:
        kubernetes_task(backend_options={"container_security_context": context, "pod_security": "baseline"})
    _refusal_names(err.value, "backend_options['container_security_context']", f"securityContext.{path}")


def test_apparmor_annotations_in_the_options_are_refused(monkeypatch):
    with pytest.raises(InvalidSettingError) as err:
        kubernetes_task(backend_options={"annotations": {APPARMOR: "unconfined"}})
    _refusal_names(err.value, "backend_options['annotations']", APPARMOR)


@pytest.mark.parametrize("level", ["baseline", "privileged"])
def test_a_weaker_level_is_refused_unless_min_pod_security_allows_it(level, monkeypatch, kubernetes_executor):
    with pytest.raises(
        InvalidSettingError, match=rf"pod_security'\]={level!r}.*\[gpu_policy\] min_pod_security"
    ) as err:
        kubernetes_task(backend_options={"pod_security": level})  # [gpu_policy] min_pod_security: restricted by default
    assert err.value.field == "backend_options['pod_security']" and err.value.option == "min_pod_security"
    with pytest.raises(InvalidSettingError) as err:
        GpuStepOperator(
            task_id="t", command=["true"], backend="executor", gpu_count=1,
            backend_options={"kubernetes": {"pod_security": level}},
        )  # fmt: skip
    assert err.value.field == "backend_options['kubernetes']['pod_security']"
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__MIN_POD_SECURITY", level)
    kubernetes_task(backend_options={"pod_security": level})
    if level == "privileged":  # what privileged allows, it allows: the host's namespaces
        kubernetes_task(backend_options={"pod_security": level, "pod_template_dict": {"spec": {"hostNetwork": True}}})


# ---------------------------------------------------------------------------------------------- the final object
@pytest.mark.parametrize("level", ["restricted", "baseline"])
@pytest.mark.parametrize("bypass", sorted(BYPASSES))
def test_a_pod_template_file_with_a_bypass_is_refused_when_the_pod_is_built(bypass, level, tmp_path, monkeypatch):
    """A template file is read when the task runs: the pod KubernetesPodOperator builds from it is refused."""
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__MIN_POD_SECURITY", level)
    template, path = BYPASSES[bypass]
    file = tmp_path / "pod.yaml"
    file.write_text(yaml.safe_dump(template))
    task = kubernetes_task(backend_options={"pod_template_file": str(file), "pod_security": level})  # not read yet
    if bypass in POD_CONTEXT and level == "restricted":
        _, pod = task.render_manifests()  # the provider's pod context replaced the template's: nothing to refuse
        assert validate(pod)["spec"]["securityContext"].get("sysctls") is None
        return
    anywhere = re.escape(path).replace(r"\[0\]", r"\[\d+\]").replace(r"\[1\]", r"\[\d+\]")  # merged lists
    with pytest.raises(GpuTaskError, match=rf"Refusing to submit pod .*{level} Pod Security.*{anywhere}"):
        task.render_manifests()


def test_the_providers_own_pods_meet_the_restricted_level():
    from airflow_gpu_provider.policy.pods import violations

    image = ImageSettings(requirements=["six"], index_url="https://pypi.example.com/simple")
    for resources in (ResourceSettings(gpu_count=2, accelerator="A100"), ResourceSettings(cpu_count=2)):
        _, [pod] = plan_and_render(resources, image, {"checkpoint_claim": "ckpt", "index_secret": "netrc"})
        assert [c["name"] for c in pod["spec"]["initContainers"]] == ["install-requirements"]
        assert violations(pod, "restricted") == []  # validate() ran the suite's own profile check too


def train():
    return 1


def test_the_multi_node_job_meets_the_restricted_level():
    from airflow_gpu_provider.operators.accelerate import AccelerateOperator
    from airflow_gpu_provider.policy.pods import violations

    task = AccelerateOperator(
        task_id="two_nodes", python_callable=train, backend="kubernetes", num_machines=2,
        resources=ResourceSettings(accelerator="A100:4"), requirements=["six"], backend_options={"namespace": "ml"},
    )  # fmt: skip
    _, _, job = (validate(obj) for obj in task.render_manifests())  # the Secret, the Service, the Job
    assert job["kind"] == "Job" and violations(job, "restricted") == []
