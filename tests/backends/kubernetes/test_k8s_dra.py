"""DRA (``gpu_allocation="dra"``): the ResourceClaimTemplate and the pod that names it, rendered by the real code and
checked with kubernetes-validate (strict, Kubernetes 1.34 and 1.37) and the restricted profile; the golden files
show one ResourceSettings, and its try after a GPU OOM, both ways. Regenerate them with ``UPDATE_GOLDEN=1``."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml
from conftest import REPO
from helpers import dag_bag
from k8s_manifests import DRA_VERSIONS, main_container, plan_and_render, validate, with_secret

from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.render import to_yaml
from airflow_gpu_provider.settings import ResourceSettings

GOLDEN = REPO / "tests" / "backends" / "kubernetes" / "golden"
DRA = {"gpu_allocation": "dra"}


def _claim_request(template):
    [request] = template["spec"]["spec"]["devices"]["requests"]
    return request


def _expressions(request):
    return [s["cel"]["expression"] for s in request.get("selectors") or []]


def test_the_pod_names_its_claim_template_and_asks_for_no_extended_resource():
    _, [template, pod] = plan_and_render(
        ResourceSettings(accelerator="A100-80GB", gpu_count=2, cpu_count=4), options=DRA
    )
    assert template["kind"] == "ResourceClaimTemplate" and template["apiVersion"] == "resource.k8s.io/v1"
    assert template["metadata"]["name"] == pod["metadata"]["name"] + "-gpu"
    assert template["metadata"]["namespace"] == pod["metadata"]["namespace"] == "ml"
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": template["metadata"]["name"]}]
    base = main_container(pod)
    assert base["resources"]["claims"] == [{"name": "gpu"}]
    assert base["resources"]["limits"] == {"cpu": "4"} and "nvidia.com/gpu" not in base["resources"]["requests"]
    assert not pod["spec"].get("nodeSelector")  # the claim selects the model, not node labels
    exact = _claim_request(template)["exactly"]
    assert (exact["deviceClassName"], exact["allocationMode"], exact["count"]) == ("gpu.nvidia.com", "ExactCount", 2)
    assert _expressions(exact) == [
        'device.attributes["gpu.nvidia.com"].productName.matches("(?i)(^|[ -])A100([ -]|$)") && '
        'device.attributes["gpu.nvidia.com"].productName.matches("(?i)(^|[ -])80GB([ -]|$)")'
    ]
    for sidecar in pod["spec"]["containers"][1:]:  # the XCom sidecar holds no claim
        assert "claims" not in (sidecar.get("resources") or {})


def test_a_fallback_list_is_first_available_in_its_order():
    _, [template, _] = plan_and_render(ResourceSettings(accelerator=["H100", "A100-80GB", "L40S"]), options=DRA)
    first = _claim_request(template)["firstAvailable"]
    assert [s["name"] for s in first] == ["h100", "a100-80gb", "l40s"]
    assert all(s["deviceClassName"] == "gpu.nvidia.com" and s["count"] == 1 for s in first)
    assert "H100" in _expressions(first[0])[0] and "L40S" in _expressions(first[2])[0]


def test_a_mig_slice_is_its_own_device_class_with_its_profile():
    _, [template, pod] = plan_and_render(ResourceSettings(accelerator="A100", mig_profile="3g.20gb"), options=DRA)
    exact = _claim_request(template)["exactly"]
    assert exact["deviceClassName"] == "mig.nvidia.com" and exact["count"] == 1
    assert 'device.attributes["gpu.nvidia.com"].profile == "3g.20gb"' in _expressions(exact)
    assert not any(k.startswith("nvidia.com/mig") for k in main_container(pod)["resources"].get("limits", {}))


def test_a_try_after_a_gpu_oom_asks_for_more_memory_than_the_card_that_ran_out():
    from airflow_gpu_provider.backends import BACKENDS
    from airflow_gpu_provider.config.worker import GpuConfig
    from airflow_gpu_provider.settings import ImageSettings
    from airflow_gpu_provider.task.envelope import Envelope
    from airflow_gpu_provider.task.request import TaskRequest

    request = TaskRequest(
        ResourceSettings(gpu_count=1), ImageSettings(), Envelope.run(["true"]), "fail",
        {"dag_id": "d", "task_id": "train", "run_id": "r", "try_number": "2", "map_index": "-1"},
        min_gpu_memory=24 * 2**30,
    )  # fmt: skip
    backend = BACKENDS["kubernetes"].create({"namespace": "ml", **DRA})
    _, [template, _] = with_secret([validate(o) for o in backend.render(request, GpuConfig.read(), None)])
    assert _expressions(_claim_request(template)["exactly"]) == [
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("24Gi")) > 0'
    ]


@pytest.mark.parametrize(
    ("vendor", "device_class", "selectors"),
    [("amd", "gpu.amd.com", ['device.attributes["gpu.amd.com"].type == "amdgpu"']), ("intel", "gpu.intel.com", [])],
)
def test_amd_and_intel_gpus_use_their_drivers_classes(vendor, device_class, selectors):
    _, [template, pod] = plan_and_render(ResourceSettings(gpu_count=2, gpu_vendor=vendor), options=DRA)
    exact = _claim_request(template)["exactly"]
    assert (exact["deviceClassName"], exact["count"], _expressions(exact)) == (device_class, 2, selectors)
    assert main_container(pod)["resources"].get("limits", {}) == {}


@pytest.mark.parametrize(
    ("kwargs", "field", "why"),
    [
        ({"gpu_count": 1, "gpu_vendor": "aws-neuron"}, "gpu_vendor='aws-neuron'", "no DRA device class"),
        ({"gpu_count": 1, "gpu_vendor": "google-tpu"}, "gpu_vendor='google-tpu'", "no DRA device class"),
        ({"accelerator": "MI300X"}, "accelerator=['MI300X']", "publishes no product name"),
    ],
)
def test_what_no_known_driver_serves_is_refused_at_parse(kwargs, field, why):
    with pytest.raises(InvalidSettingError) as raised:
        GpuStepOperator(task_id="t", command=["true"], backend="kubernetes", backend_options=DRA, **kwargs)
    message = str(raised.value)
    assert field in message and why in message and "gpu_allocation': 'device-plugin'" in message


def test_a_pod_template_with_claims_of_its_own_is_refused_at_parse():
    template = {
        "spec": {"resourceClaims": [{"name": "x", "resourceClaimName": "shared"}], "containers": [{"name": "base"}]}
    }
    with pytest.raises(InvalidSettingError, match=r"backend_options\['pod_template_dict'\].*holds resource claims"):
        GpuStepOperator(
            task_id="t", command=["true"], backend="kubernetes", gpu_count=1,
            backend_options={**DRA, "pod_template_dict": template},
        )  # fmt: skip


def test_a_bad_allocation_name_is_refused_at_parse():
    with pytest.raises(InvalidSettingError, match=r"gpu_allocation'\]='DRA' is invalid: unknown value.*'dra'"):
        GpuStepOperator(task_id="t", command=["true"], backend="kubernetes", backend_options={"gpu_allocation": "DRA"})


def test_the_worker_default_comes_from_the_kubernetes_connections_gpu_allocation(monkeypatch):
    """A cluster fact lives in its connection (issue 37); a task's backend_options still override it."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps({"conn_type": "kubernetes", "extra": {"gpu_allocation": "dra"}})
    )
    _, objects = plan_and_render(ResourceSettings(gpu_count=1))
    assert [o["kind"] for o in objects] == ["ResourceClaimTemplate", "Pod"]  # and the task's Secret before them
    _, objects = plan_and_render(ResourceSettings(gpu_count=1), options={"gpu_allocation": "device-plugin"})
    assert [o["kind"] for o in objects] == ["Pod"]
    _, objects = plan_and_render(ResourceSettings())  # a CPU task: no claim
    assert [o["kind"] for o in objects] == ["Pod"]


def test_the_removed_gpu_kubernetes_gpu_allocation_still_works_for_one_release_and_warns(monkeypatch):
    from airflow.exceptions import AirflowProviderDeprecationWarning

    monkeypatch.delenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", raising=False)
    monkeypatch.setenv("AIRFLOW__GPU__KUBERNETES_GPU_ALLOCATION", "dra")
    with pytest.warns(AirflowProviderDeprecationWarning, match="set the Kubernetes connection's extra gpu_allocation"):
        _, objects = plan_and_render(ResourceSettings(gpu_count=1))
    assert [o["kind"] for o in objects] == ["ResourceClaimTemplate", "Pod"]


def test_a_multi_node_job_has_one_claim_template_and_each_pod_its_claim():
    """The Indexed Job's pod template names the Job's claim template; rendered: template, Service, Job."""
    from airflow_gpu_provider.backends import BACKENDS
    from airflow_gpu_provider.config.worker import GpuConfig
    from airflow_gpu_provider.settings import ImageSettings
    from airflow_gpu_provider.task.envelope import Envelope
    from airflow_gpu_provider.task.request import TaskRequest

    request = TaskRequest(
        ResourceSettings(accelerator=["H100", "A100-80GB"], gpu_count=8), ImageSettings(), Envelope.run(["true"]),
        "fail", {"dag_id": "d", "task_id": "train", "run_id": "r", "try_number": "1", "map_index": "-1"}, num_nodes=2,
    )  # fmt: skip
    backend = BACKENDS["kubernetes"].create({"namespace": "ml", **DRA})
    _, [template, service, job] = with_secret([validate(o) for o in backend.render(request, GpuConfig.read(), None)])
    assert [template["kind"], service["kind"], job["kind"]] == ["ResourceClaimTemplate", "Service", "Job"]
    assert template["metadata"]["name"] == job["metadata"]["name"] + "-gpu"
    spec = job["spec"]["template"]["spec"]
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": template["metadata"]["name"]}]
    assert spec["containers"][0]["resources"]["claims"] == [{"name": "gpu"}]
    assert "nvidia.com/gpu" not in spec["containers"][0]["resources"].get("limits", {})
    assert [s["name"] for s in _claim_request(template)["firstAvailable"]] == ["h100", "a100-80gb"]


def test_the_claim_template_the_operator_creates_is_the_rendered_one():
    """The create call's body, built with the kubernetes client's own models (no cluster: nothing is sent)."""
    from kubernetes.client import ApiClient, V1Job, V1ObjectMeta

    from airflow_gpu_provider.backends.kubernetes.companions import ClaimTemplate
    from airflow_gpu_provider.backends.kubernetes.pod_operator import build_operator, to_dict

    plan, [rendered, _] = plan_and_render(ResourceSettings(accelerator=["H100", "A100-80GB"]), options=DRA)
    operator = build_operator(plan)
    pod = operator.build_pod_request_obj(None, dry_run=True)
    claims = ClaimTemplate(plan.claim, ApiClient(), operator.log)
    name = claims.name(pod.metadata.name)
    body = claims.body(name, pod.metadata.namespace, dict(pod.metadata.labels))
    assert type(body).__name__ == "V1ResourceClaimTemplate"
    assert to_dict(body) == {**rendered, "metadata": {**rendered["metadata"], "name": f"{pod.metadata.name}-gpu"}}
    pod.metadata.uid = "0b7e2c64-1f7a-4b8e-9a55-8d3c3c1c2a10"
    job = V1Job(metadata=V1ObjectMeta(name="train-abc", uid="5d1c6a7e-0f6e-4a55-9b7e-3c2b1a0f9e8d"))
    for owner, kind, api_version in ((pod, "Pod", "v1"), (job, "Job", "batch/v1")):
        patch = claims.owner_patch(owner, kind, api_version)
        reference = {"apiVersion": api_version, "kind": kind, "name": owner.metadata.name, "uid": owner.metadata.uid}
        assert patch == {"metadata": {"ownerReferences": [reference]}}
        owned = to_dict(body)
        owned["metadata"].update(patch["metadata"])
        validate(owned, versions=DRA_VERSIONS)


# ---------------------------------------------------------------------------------------------- golden renderings
CASES = {
    f"dra_render.{task}{suffix}.yaml": (task, after)
    for task in ("train_device_plugin", "train_dra")
    for suffix, after in (("", ()), (".after_gpu_oom", ("gpu_oom",)))
}


def golden_text(task_id: str, after: tuple[str, ...]) -> str:
    """The task's objects as YAML, with what changes on every call (the pod's random suffix, versions, the shipped
    runtime and envelope) replaced by placeholders."""
    bag = dag_bag(REPO / "tests" / "backends" / "kubernetes" / "dra_render_dag.py")
    assert bag.import_errors == {}
    [dag] = bag.dags.values()
    objects = [validate(o) for o in dag.get_task(task_id).render_manifests(after=after)]
    with_secret(objects)
    objects[0]["data"]["envelope"] = "<the task's envelope: base64 of AIRFLOW_GPU_ENVELOPE>"
    pod = objects[-1]
    for container in pod["spec"]["containers"]:
        for variable in container.get("env") or []:
            if variable["name"] == "AIRFLOW_GPU_BOOTSTRAP":
                variable["value"] = f"<{variable['name']}>"
    for obj in objects:
        obj["metadata"]["labels"]["airflow_version"] = "<airflow version>"
    text = to_yaml(objects)
    return text.replace(pod["metadata"]["name"], re.sub(r"-[a-z0-9]{8}$", "-<random>", pod["metadata"]["name"]))


@pytest.mark.parametrize("golden", sorted(CASES))
def test_one_resource_settings_rendered_both_ways_matches_the_golden_files(airflow_home, golden):
    text = golden_text(*CASES[golden])
    path = GOLDEN / golden
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{golden} changed; review and rerun with UPDATE_GOLDEN=1"
    kinds = [doc["kind"] for doc in yaml.safe_load_all(text)]
    assert kinds == (["Secret", "ResourceClaimTemplate", "Pod"] if "train_dra" in golden else ["Secret", "Pod"])


def test_the_worked_example_in_the_docs_is_the_golden_rendering():
    """docs/kubernetes-admin.md shows the claim template as the real code renders it (the golden file)."""
    text = (REPO / "docs" / "kubernetes-admin.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    shown = next(list(yaml.safe_load_all(b)) for b in blocks if b.startswith("apiVersion: resource.k8s.io/v1"))
    golden = list(yaml.safe_load_all((GOLDEN / "dra_render.train_dra.yaml").read_text()))[1:]  # the Secret: not shown
    assert shown[0] == golden[0]
    assert shown[1]["spec"]["resourceClaims"] == golden[1]["spec"]["resourceClaims"]
    assert shown[1]["spec"]["containers"][0]["resources"] == golden[1]["spec"]["containers"][0]["resources"]
