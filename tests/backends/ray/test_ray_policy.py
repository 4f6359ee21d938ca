"""The Ray backend's boundary without a cluster (issue 34, H4; issue 36): which clusters, with which token, whose jobs,
and what the job's first process does on its node before the task runs (``reaper.py``).

The end-to-end half runs on the tests' real cluster (token auth on) in test_ray_backend.py and test_ray_reattach.py.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_gpu_provider import ImageSettings, ResourceSettings
from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.backends.ray import connection, durable, reaper
from airflow_gpu_provider.backends.ray.clusters import RayClusters
from airflow_gpu_provider.backends.ray.connection import endpoint
from airflow_gpu_provider.backends.ray.options import RayOptions
from airflow_gpu_provider.backends.ray.plan import ENVELOPE, plan_job
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.host.workers import deployment
from airflow_gpu_provider.policy import Policy, PolicyError
from airflow_gpu_provider.runtime.protocol import RESULT_MARKER
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.runtime_zip import FILE_NAME, archive

RAY = BACKENDS["ray"]
IDENTITY = {"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": "-1"}


@pytest.fixture
def cluster(monkeypatch) -> Iterator[tuple[str, list[int]]]:
    """A local HTTP server answering ``GET /api/version`` with the status the test puts in the list (401 first)."""
    answers = [401]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(answers[0])
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(connection, "_AUTHENTICATED", set())
    try:
        yield f"http://127.0.0.1:{server.server_port}", answers
    finally:
        server.shutdown()
        server.server_close()


def _default(monkeypatch, address: str, password: str | None) -> None:
    value = {"conn_type": "ray", "extra": {"address": address}, **({"password": password} if password else {})}
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps(value))


def test_a_task_reaches_only_the_deployments_cluster_or_a_listed_one(monkeypatch):
    """Rule R1 at parse: a literal address must be ray_default's or listed as ray=ADDRESS in [gpu_policy] (one reader)."""
    monkeypatch.delenv("AIRFLOW_CONN_RAY_DEFAULT", raising=False)
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CLUSTERS", "docker=tcp://gpu-1:2376, ray=HTTP://Ray-Head:8265/")
    RAY.parse_options({"address": "http://ray-head:8265"}).permitted("task 't'")
    with pytest.raises(PolicyError, match=r"backend_options\['address'\]='http://evil:8265'.*allowed_clusters"):
        RAY.parse_options({"address": "http://evil:8265"}).permitted("task 't'")
    _default(monkeypatch, "http://evil:8265", None)  # the deployment's own cluster needs no listing
    RAY.parse_options({"address": "http://evil:8265"}).permitted("task 't'")
    listed = RayClusters.of(Policy.of(GpuConfig.read(allowed_clusters="ray-unauthenticated=http://lab:8265")))
    assert listed.without_token("http://LAB:8265/") and listed.listed == {"http://lab:8265"}
    for bad, why in (("ray=head:8265", "ray=URL"), ("ray", "KIND=ADDRESS"), ("rey=http://h:8265", "KIND one of")):
        with pytest.raises(ValueError, match=why):
            RayClusters.of(Policy.of(GpuConfig.read(allowed_clusters=bad)))


def test_no_token_or_a_cluster_without_token_auth_is_refused_unless_the_admin_opts_in(monkeypatch, cluster):
    address, answers = cluster
    monkeypatch.delenv("AIRFLOW__GPU_POLICY__ALLOWED_CLUSTERS", raising=False)
    _default(monkeypatch, address, None)
    with pytest.raises(GpuTaskError, match="No token for the Ray cluster .* password of the Ray connection"):
        endpoint(None, None)
    _default(monkeypatch, address, "the-token")
    found = endpoint(None, None)  # the cluster refused a request without the token (401): token auth is on
    assert found.settings["headers"] == {"Authorization": "Bearer the-token"}
    _default(monkeypatch, address, None)  # a cluster known to enforce its token still needs one
    with pytest.raises(GpuTaskError, match="No token"):
        endpoint(None, None)
    _default(monkeypatch, address, "the-token")
    answers[0] = 200  # a cluster that answers anyone
    monkeypatch.setattr(connection, "_AUTHENTICATED", set())
    with pytest.raises(GpuTaskError, match="accepts requests without a token.*ray-unauthenticated="):
        endpoint(None, None)
    _default(monkeypatch, address, None)
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CLUSTERS", f"ray-unauthenticated={address}")  # the admin's choice
    assert endpoint(None, None).address == address == endpoint("ray_default", None).address
    with pytest.raises(PolicyError, match="allowed_clusters"):  # checked before any request: no token leaves
        endpoint(None, "http://127.0.0.1:9")


def test_a_job_is_only_its_own_task_instances_of_its_own_deployment():
    """durable.mine, before a job is followed or stopped: the identity AND the deployment (a Low of issue 34)."""
    ours = {**IDENTITY, "airflow_gpu_provider": "true", "deployment": deployment()}
    assert durable.mine(ours, IDENTITY)
    assert not durable.mine({**ours, "deployment": "another-deployment"}, IDENTITY)  # same DAGs, another Airflow
    assert not durable.mine({**ours, "run_id": "other"}, IDENTITY)
    assert not durable.mine({**ours, "airflow_gpu_provider": "false"}, IDENTITY)
    # what a try submits is what its trigger and the listener recognise, from their task instance
    request = TaskRequest(
        ResourceSettings(), ImageSettings(), Envelope.run(["true"]), labels={**IDENTITY, "try_number": "1"}
    )
    submitted = {**plan_job(request, RayOptions(), GpuConfig.read()).metadata, "deployment": deployment()}
    task_instance = SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=-1, try_number=3)
    assert durable.mine(submitted, durable.identity_of(task_instance))


def _job_folder(tmp_path: Path, envelope: dict, environment: dict[str, str]) -> Path:
    """A job's working_dir as Ray unpacks it on a node: the runtime, the envelope, the task's variables."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / FILE_NAME).write_bytes(archive())
    (tmp_path / ENVELOPE).write_text(json.dumps(envelope))
    (tmp_path / reaper.ENVIRONMENT).write_text(json.dumps(environment))
    return tmp_path


def _reaper(folder: Path, **environment: str) -> subprocess.CompletedProcess[str]:
    run = [sys.executable, str(Path(reaper.__file__)), FILE_NAME, ENVELOPE, "-"]
    env = {"PATH": "/usr/bin:/bin", **environment}
    return subprocess.run(run, cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False)


def _result(out: str) -> dict:
    return json.loads(next(line for line in out.splitlines() if line.startswith(RESULT_MARKER))[len(RESULT_MARKER) :])


def test_the_task_gets_its_variables_from_the_working_dir_which_keeps_no_copy(tmp_path):
    """The secrets travel in no runtime_env (ray logs it on every node): the reaper sets them, then they are gone."""
    command = [sys.executable, "-c", "import os; print('token is', os.environ['WANDB_API_KEY'])"]
    request = TaskRequest(ResourceSettings(), ImageSettings(), Envelope.run(command), labels=IDENTITY)
    envelope = request.runtime_envelope(backend="ray", image="Ray cluster", gpus=[])
    folder = _job_folder(tmp_path, envelope, {"WANDB_API_KEY": "wandb-secret"})
    ran = _reaper(folder)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "token is wandb-secret" in ran.stdout and _result(ran.stdout)["ok"] is True
    assert f"[gpu] Ray runs the task with {sys.executable} (Python " in ran.stdout  # issue 36: which interpreter
    assert sorted(p.name for p in folder.iterdir()) == [FILE_NAME]  # neither the envelope nor the variables left


def test_imports_that_do_not_resolve_on_the_nodes_python_fail_the_job_at_once_naming_it(tmp_path):
    """Issue 36: a job ran the system Python ('No module named torch'); now it says which Python and what to do."""
    source = "def train():\n    import json\n    import airflow_gpu_no_such_module.sub\n    try:\n        import optional\n    except ImportError:\n        pass\n"
    envelope = {"version": 2, "mode": "callable", "function": "train", "source": source, "args": [], "kwargs": {}}
    assert reaper.task_imports(envelope) == ["json", "airflow_gpu_no_such_module"]  # not the one under try
    refused = _reaper(_job_folder(tmp_path, envelope, {}))
    assert refused.returncode == 2
    message = _result(refused.stdout)["error"]["message"]
    assert message.startswith("the task imports airflow_gpu_no_such_module, which this Ray node's Python cannot: ")
    assert f"{sys.executable} (Python " in message and "ray start" in message and "requirements=" in message


def test_a_node_without_the_checkpoint_folder_the_worker_made_refuses_the_task(tmp_path):
    """The reaper, first on every node: a folder the worker made that the node lacks is a file system not shared."""
    command = [sys.executable, "-c", "print('the task ran')"]
    request = TaskRequest(ResourceSettings(), ImageSettings(), Envelope.run(command), labels=IDENTITY)
    folder = _job_folder(tmp_path / "job", request.runtime_envelope(backend="ray", image="x", gpus=[]), {})
    missing = tmp_path / "not-on-this-node"
    refused = _reaper(folder, **{reaper.ON_WORKER: str(missing)})
    assert refused.returncode == 2 and "the task ran" not in refused.stdout
    assert f"checkpoint folder {missing}, made by the Airflow worker, is not on this Ray node" in refused.stderr
    folder = _job_folder(tmp_path / "job", request.runtime_envelope(backend="ray", image="x", gpus=[]), {})
    ran = _reaper(folder, **{reaper.ON_WORKER: str(tmp_path)})
    assert ran.returncode == 0 and "the task ran" in ran.stdout


def test_what_the_task_leaves_running_on_its_node_is_stopped_by_the_pinned_subreaper(tmp_path):
    """After its pre-flight the reaper runs the runtime beneath runtime/reaper.py's subreaper (the job wing's)."""
    script = "import subprocess; print('left', subprocess.Popen(['sleep', '300'], start_new_session=True).pid)"
    request = TaskRequest(ResourceSettings(), ImageSettings(), Envelope.run([sys.executable, "-c", script]))
    ran = _reaper(_job_folder(tmp_path, request.runtime_envelope(backend="ray", image="x", gpus=[]), {}))
    assert ran.returncode == 0 and _result(ran.stdout)["ok"] is True, ran.stdout + ran.stderr
    pid = int(next(line for line in ran.stdout.splitlines() if line.startswith("left "))[5:])
    assert not Path(f"/proc/{pid}").exists()  # a setsid grandchild, re-parented to the reaper, SIGTERMed and reaped


def test_a_task_variable_cannot_lengthen_the_subreapers_grace(tmp_path):
    """The task's own variables reach the runtime, not the subreaper: a child that ignores SIGTERM still gets SIGKILL
    after the provider's grace (2 s here), not after the 600 s the task asked for."""
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"
    script = (
        f"import subprocess, sys; child = subprocess.Popen([sys.executable, '-c', {stubborn!r}], start_new_session=True, "
        "stdout=subprocess.PIPE); child.stdout.readline(); print('left', child.pid)"
    )
    request = TaskRequest(ResourceSettings(), ImageSettings(), Envelope.run([sys.executable, "-c", script]))
    envelope = request.runtime_envelope(backend="ray", image="x", gpus=[])
    started = time.monotonic()
    ran = _reaper(_job_folder(tmp_path, envelope, {"AIRFLOW_GPU_KILL_GRACE": "600"}), AIRFLOW_GPU_KILL_GRACE="2")
    assert ran.returncode == 0 and time.monotonic() - started < 60, ran.stdout + ran.stderr
    pid = int(next(line for line in ran.stdout.splitlines() if line.startswith("left "))[5:])
    assert not Path(f"/proc/{pid}").exists()
