"""AccelerateOperator on Kubernetes: a multi-node launch as an Indexed Job plus a headless Service.

No cluster can be had here: the manifests are built by the real KubernetesPodOperator code and validated against
the official schemas, each pod's exact ``accelerate launch`` command line is derived with the runtime's own
function, and the Job's container is run for real as two "nodes" on a Docker network, pod 0 reachable under the
DNS name the headless Service would give it.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import uuid

import pytest
from conftest import REPO
from helpers import load_dag
from k8s_manifests import env, secret_value, validate, with_secret
from shipped_runtime import shipped

from airflow_gpu_provider.backends.kubernetes.container import ENVELOPE_ENV
from airflow_gpu_provider.backends.kubernetes.multinode import COMPLETION_INDEX
from airflow_gpu_provider.backends.kubernetes.multinode_run import result_from_log
from airflow_gpu_provider.runtime.protocol import RESULT_MARKER

DAG_FILE = REPO / "tests" / "dags" / "accelerate_dags.py"
pytestmark = pytest.mark.usefixtures("airflow_home")


def render(task_id: str) -> tuple[dict, dict]:
    manifests = load_dag(DAG_FILE, "accelerate_kubernetes").get_task(task_id).render_manifests()
    secret, [service, job] = with_secret([validate(obj) for obj in manifests])  # one Secret for all the Job's pods
    assert (service["kind"], job["kind"]) == ("Service", "Job")
    job["envelope"] = secret_value(secret)  # what the kubelet sets AIRFLOW_GPU_ENVELOPE to
    return service, job


def wait_as_the_job_controller(names: list[str], timeout_s: float) -> list[int]:
    """Each node's exit status; once one fails the others are stopped, as a Job with backoffLimit 0 ends its pods.

    Without that, node 0's torch elastic agent would wait out its 300 s exit barrier for the failed node's agent.
    """
    waits = {name: subprocess.Popen(["docker", "wait", name], stdout=subprocess.PIPE, text=True) for name in names}
    codes: dict[str, int] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(codes) < len(names):
            assert time.monotonic() < deadline, f"the nodes still ran after {timeout_s:g}s"
            for name, wait in waits.items():
                if name not in codes and wait.poll() is not None:
                    status = wait.communicate()[0].strip()
                    codes[name] = int(status) if status else -1  # -1: the container was gone
                    if codes[name]:
                        subprocess.run(["docker", "stop", "-t", "5", *names], capture_output=True, check=False)
            time.sleep(0.2)
    finally:
        for wait in waits.values():
            wait.kill()
    return [codes[name] for name in names]


def shown(log: subprocess.CompletedProcess[str]) -> str:
    """A node's log in a failure message: its stderr whole (the ranks' last words), its output but the result line."""
    output = "\n".join(line for line in log.stdout.splitlines() if not line.startswith(RESULT_MARKER))
    return f"{output[-2000:]}\n--- stderr ---\n{log.stderr[-8000:]}"


def test_two_nodes_times_four_gpus_bf16_job_service_and_command_lines():
    service, job = render("two_nodes")
    name = service["metadata"]["name"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    pod = job["spec"]["template"]["spec"]
    main = pod["containers"][0]
    assert [c["name"] for c in pod["containers"]] == ["base"]  # no XCom sidecar in a Job
    assert main["resources"]["limits"]["nvidia.com/gpu"] == main["resources"]["requests"]["nvidia.com/gpu"] == "4"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.product"  # any A100 (GPU Feature Discovery)
    assert "NVIDIA-A100-SXM4-80GB" in terms[0]["matchExpressions"][0]["values"]
    variables = env(main)
    assert variables["NODE_RANK"] == {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
    main_address = f"{name}-0.{name}.ml.svc.cluster.local"
    assert variables["MASTER_ADDR"] == main_address
    assert main["args"] == ["env:AIRFLOW_GPU_ENVELOPE", "-"]  # the result goes to the log: a Job has no sidecar
    # 16 CPUs a pod, 4 ranks on each of the 2 nodes: 4 threads a rank
    assert variables["OMP_NUM_THREADS"] == variables["MKL_NUM_THREADS"] == "4"

    envelope = json.loads(base64.b64decode(job["envelope"]))
    pod_env = {"NODE_RANK": "", "MASTER_ADDR": main_address, "MASTER_PORT": "29500"}
    for rank in (0, 1):
        argv = shipped("launch").launch_command(
            envelope, "env:AIRFLOW_GPU_ENVELOPE", "/tmp/ranks", {**pod_env, "NODE_RANK": str(rank)}
        )
        assert argv[1:5] == [argv[-4], "launcher", "/tmp/ranks/failures.json", "accelerate.commands.launch"]
        assert argv[5:] == [
            "--num_machines",
            "2",
            "--mixed_precision",
            "bf16",
            "--dynamo_backend",
            "no",  # stated: accelerate would warn that it filled it in
            "--num_processes",
            "8",
            "--multi_gpu",
            "--tee",
            "3",  # 4 ranks a machine: torch elastic writes each one's lines whole, with its rank
            "--machine_rank",
            str(rank),
            "--main_process_ip",
            main_address,
            "--main_process_port",
            "29500",
            "--log_dir",
            "/tmp/ranks/output",
            argv[-4],
            "env:AIRFLOW_GPU_ENVELOPE",
            "--rank-results",
            "/tmp/ranks",
        ]
        assert argv[-4].endswith(".pyz")  # the runtime's archive, which every rank runs again


@pytest.mark.docker
@pytest.mark.slow
def test_the_jobs_container_runs_as_two_nodes(monkeypatch, torch_image):
    """Two containers from the Job's pod template, NODE_RANK 0 and 1, pod 0 under its Service DNS name."""
    cluster = {"conn_type": "kubernetes", "extra": {"parent_image": torch_image}}  # the cluster's parent image
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(cluster))

    _, job = render("two_cpu_nodes")
    main = job["spec"]["template"]["spec"]["containers"][0]
    variables = {**env(main), ENVELOPE_ENV: job["envelope"]}  # from the Job's Secret, as the kubelet sets it
    network = f"airflow-gpu-test-{uuid.uuid4().hex[:8]}"
    names = [f"{network}-node{rank}" for rank in (0, 1)]
    subprocess.run(["docker", "network", "create", network], check=True, capture_output=True)
    try:
        for rank, name in enumerate(names):
            argv = [
                "docker",
                "run",
                "-d",
                "--name",
                name,
                "--network",
                network,
                "--label",
                "airflow-gpu-provider-test=pod-in-docker",
                "--shm-size",
                "1g",
                "-e",
                "PYTHONFAULTHANDLER=1",  # a rank killed by SIGABRT or SIGSEGV prints each thread's Python stack
            ]
            if rank == 0:
                argv += ["--network-alias", variables["MASTER_ADDR"]]
            for key, value in variables.items():
                argv += ["-e", f"{key}={rank if key == 'NODE_RANK' else value}"]
            argv += ["--entrypoint", main["command"][0], main["image"], *main["command"][1:], *main["args"]]
            subprocess.run(argv, check=True, capture_output=True)
        codes = wait_as_the_job_controller(names, timeout_s=540)
        logs = [subprocess.run(["docker", "logs", n], capture_output=True, text=True, check=False) for n in names]
    finally:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True, check=False)
        subprocess.run(["docker", "network", "rm", network], capture_output=True, check=False)
    assert codes == [0, 0], "\n\n".join(
        f"=== node {rank}: exit {code}\n{shown(log)}" for rank, (code, log) in enumerate(zip(codes, logs))
    )
    result = result_from_log(logs[0].stdout)
    assert result is not None and result["ok"], shown(logs[0])
    assert result["return_value"]["world_size"] == 2  # one process on each "node", seen by the ranks
    assert result["return_value"]["ranks"] == [0, 1]
    assert result["return_value"]["backend"] == "gloo"
    assert result_from_log(logs[1].stdout)["return_value"] is None  # rank 0 lives on node 0
    assert "--machine_rank 1" in logs[1].stdout and f"--main_process_ip {variables['MASTER_ADDR']}" in logs[1].stdout
