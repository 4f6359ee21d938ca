"""Multi-node primitive: Indexed Job + headless Service, built from the real single-pod manifest and validated
against the official schemas. The runner (IndexedJobRun) needs a cluster and is not run here."""

from __future__ import annotations

import dataclasses

import pytest
from k8s_manifests import env, plan_and_render, validate

from airflow_gpu_provider.backends.kubernetes.multinode import (
    COMPLETION_INDEX,
    JOB_LABEL,
    MultiNodeLayout,
    headless_service,
    indexed_job,
)
from airflow_gpu_provider.backends.kubernetes.multinode_run import multinode_manifests as build
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings import ResourceSettings


def multinode_manifests(plan, num_nodes, port=29500):
    return build(dataclasses.replace(plan, num_nodes=num_nodes, port=port))


@pytest.fixture(scope="module")
def plan():
    plan, _ = plan_and_render(ResourceSettings(accelerator="H100:8", cpu_count=32, memory="512Gi", shm_size="64Gi"))
    return plan


def test_indexed_job_and_headless_service_are_schema_valid(plan):
    layout, service, job = multinode_manifests(plan, 4, port=29500)
    validate(service)
    validate(job)
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["ttlSecondsAfterFinished"] == 3600
    template = job["spec"]["template"]
    assert template["spec"]["subdomain"] == service["metadata"]["name"] == layout.name
    assert template["metadata"]["labels"][JOB_LABEL] == layout.name
    assert service["spec"]["selector"] == {JOB_LABEL: layout.name}
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True


def test_every_pod_gets_rank_from_the_completion_index_and_pod_zero_as_main_address(plan):
    layout, _, job = multinode_manifests(plan, 3, port=23456)
    base = job["spec"]["template"]["spec"]["containers"][0]
    variables = env(base)
    assert variables["NODE_RANK"] == {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
    assert variables["NUM_NODES"] == "3"
    assert variables["MASTER_PORT"] == "23456"
    assert variables["MASTER_ADDR"] == f"{layout.name}-0.{layout.name}.ml.svc.cluster.local"
    assert {"name": "main", "containerPort": 23456, "protocol": "TCP"} in base["ports"]
    # the GPU request, the shipped runtime and the shm volume carry over from the single pod
    assert base["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "AIRFLOW_GPU_ENVELOPE" in variables
    assert any(v["name"] == "dshm" for v in job["spec"]["template"]["spec"]["volumes"])


def test_job_pods_have_no_xcom_sidecar(plan):
    _, _, job = multinode_manifests(plan, 2)
    names = [c["name"] for c in job["spec"]["template"]["spec"]["containers"]]
    assert names == ["base"]  # a sidecar would keep every pod, and so the Job, running


def test_hostnames_fit_dns_labels_for_every_index(plan):
    layout, _, job = multinode_manifests(plan, 128)
    assert len(f"{layout.name}-127") <= 63
    validate(job)


def test_service_can_be_owned_by_the_job():
    layout = MultiNodeLayout("train-abc", "ml", 2)
    service = validate(headless_service(layout, {"team": "x"}, owner_uid="6b1c3d9e-0000-4000-8000-000000000001"))
    [owner] = service["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("Job", "train-abc")


def test_indexed_job_builder_from_any_pod_manifest():
    _, [pod] = plan_and_render()
    job = validate(indexed_job(MultiNodeLayout("x", "ml", 2), pod, {}))
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "Train", "namespace": "ml", "num_nodes": 2}, "name"),
        ({"name": "t" * 62, "namespace": "ml", "num_nodes": 10}, "name"),
        ({"name": "t", "namespace": "ml", "num_nodes": 0}, "num_nodes"),
        ({"name": "t", "namespace": "ML", "num_nodes": 2}, "namespace"),
        ({"name": "t", "namespace": "ml", "num_nodes": 2, "port": 70000}, "port"),
    ],
)
def test_bad_layouts_are_rejected(kwargs, field):
    with pytest.raises(InvalidSettingError) as err:
        MultiNodeLayout(**kwargs)
    assert err.value.field == field
