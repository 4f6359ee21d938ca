"""The Kubernetes backend refuses, before submitting anything, a pod or Job that breaks the task's level (M1).

A ``pod_template_file`` is read when the task runs, so the DAG parses; the pod KubernetesPodOperator builds from it,
and the multi-node Job's pod template, are checked before the first API call. The kubeconfig points at a real HTTP
server on this host that records every request: none may reach it. (Without the check, the first request is the
creation of the task's Secret, then the search for an earlier try's pod and the POST of this one.)
"""

from __future__ import annotations

import dataclasses
import http.server
import threading
from collections.abc import Iterator

import pytest
import yaml

from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.render import _RenderTaskInstance
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

ROOT_SIDECAR = {
    "spec": {
        "hostPID": True,
        "containers": [
            {"name": "base"},
            {"name": "root", "image": "busybox", "securityContext": {"privileged": True, "runAsUser": 0}},
        ],
        "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
    }
}


CONTEXT = {"ti": _RenderTaskInstance("d", "train", "manual"), "run_id": "manual", "dag": None}  # what KPO reads


class _Recorder(http.server.BaseHTTPRequestHandler):
    requests: list[str] = []

    def _any(self) -> None:
        type(self).requests.append(f"{self.command} {self.path}")
        body = b'{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403}'
        self.send_response(403)  # refused: KubernetesPodOperator stops at once, without retries
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api_server(tmp_path) -> Iterator[tuple[str, list[str]]]:
    """``(kubeconfig path, requests received)`` of a recording API server on 127.0.0.1."""
    _Recorder.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    try:
        yield str(kubeconfig), _Recorder.requests
    finally:
        server.shutdown()
        server.server_close()


def _request(num_nodes: int = 1) -> TaskRequest:
    labels = {"dag_id": "d", "task_id": "train", "run_id": "manual", "try_number": "1", "map_index": "-1"}
    envelope = Envelope.run(["python3", "-c", "print('hi')"])
    return TaskRequest(ResourceSettings(gpu_count=1), ImageSettings(), envelope, "fail", labels, num_nodes=num_nodes)


@pytest.mark.parametrize("num_nodes", [1, 2])
@pytest.mark.parametrize("level", ["restricted", "baseline"])
def test_a_template_file_that_breaks_the_level_is_refused_before_any_api_call(
    api_server, tmp_path, monkeypatch, level, num_nodes
):
    kubeconfig, requests = api_server
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__MIN_POD_SECURITY", level)
    template = tmp_path / "pod.yaml"
    template.write_text(yaml.safe_dump(ROOT_SIDECAR))
    options = {"namespace": "ml", "config_file": kubeconfig, "pod_template_file": str(template), "pod_security": level}
    backend = BACKENDS["kubernetes"].create(options)
    conf = GpuConfig.read()
    plan = backend.plan(_request(num_nodes), conf)
    context = CONTEXT
    # a Job's pod is checked as KubernetesPodOperator builds it, its pod template again when the Job is made
    with pytest.raises(GpuTaskError, match=r"Refusing to submit (pod|Indexed Job) .*spec\.hostPID=True") as err:
        backend.run(plan, context)
    paths = {v.path.removeprefix("spec.template.") for v in err.value.violations}  # type: ignore[attr-defined]
    assert {"spec.hostPID", "spec.containers[1].securityContext.privileged"} <= paths
    assert any(p.startswith("spec.volumes[") and p.endswith("].hostPath") for p in paths)
    assert requests == []  # nothing reached the API server
    with pytest.raises(GpuTaskError, match="Refusing to submit"):
        backend.render(_request(num_nodes), conf, context)  # what render_manifests shows


def test_the_same_run_reaches_the_api_server_without_the_bypass(api_server, tmp_path):
    """The control: with a template the level allows, the run gets as far as its first API call."""
    kubeconfig, requests = api_server
    template = tmp_path / "pod.yaml"
    template.write_text(yaml.safe_dump({"spec": {"nodeSelector": {"pool": "gpu"}}}))
    options = {"namespace": "ml", "config_file": kubeconfig, "pod_template_file": str(template)}
    backend = BACKENDS["kubernetes"].create(options)
    plan = dataclasses.replace(backend.plan(_request(), GpuConfig.read()), pending_timeout=1)
    with pytest.raises(Exception):  # noqa: B017 - the recorder answers 403: any failure after the first call
        backend.run(plan, CONTEXT)
    assert requests == ["POST /api/v1/namespaces/ml/secrets"]  # the task's Secret first; refused: nothing after
