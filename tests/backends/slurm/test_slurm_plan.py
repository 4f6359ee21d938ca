"""The Slurm backend's parse half and its pure logic, without a cluster: options and the admin's allow-list, the
job's mapping, the batch script, Slurm's states as failure classes, pending reasons, node avoidance, the REST
version and properties, the job's comment, and the trigger's decisions over a stream of snapshots."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import subprocess

import pytest

from airflow_gpu_provider import AccelerateOperator, ImageSettings, ResourceSettings
from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.backends.jobs.durable import JobRecord
from airflow_gpu_provider.backends.slurm import orphans, rest
from airflow_gpu_provider.backends.slurm.connection import Cluster, cluster
from airflow_gpu_provider.backends.slurm.options import SlurmOptions
from airflow_gpu_provider.backends.slurm.placement import avoided, fitting_nodes, time_limit
from airflow_gpu_provider.backends.slurm.plan import directives, gres, job_share, plan_job
from airflow_gpu_provider.backends.slurm.script import batch_script
from airflow_gpu_provider.backends.slurm.shards import enforcement, shards
from airflow_gpu_provider.backends.slurm.states import JobInfo, ended_error, job_info, never_starts, pending_reason
from airflow_gpu_provider.backends.slurm.trigger import SlurmJobTrigger
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import (
    GpuInfrastructureError,
    GpuTaskError,
    GpuUnavailableError,
    HostOutOfMemoryError,
    InvalidSettingError,
    UnknownSettingError,
)
from airflow_gpu_provider.policy import PolicyError
from airflow_gpu_provider.settings import OomEscalation
from airflow_gpu_provider.settings.shares import GpuShare
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.result import failure_class_of

SLURM = BACKENDS["slurm"]
LABELS = {"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": "-1", "try_number": "2"}
CLUSTER = Cluster("slurm_default", "/shared", accelerators={"A100": "a100", "H100-80GB": "h100"})
LOG = logging.getLogger(__name__)


def _plan(resources: ResourceSettings, image: ImageSettings | None = None, nodes: int = 1, **options):
    request = TaskRequest(
        resources, image or ImageSettings(), Envelope.run(["true"]), labels=LABELS, num_nodes=nodes,
        avoid_nodes=tuple(options.pop("avoid", ())),
    )  # fmt: skip
    return plan_job(request, SlurmOptions.parse(options), GpuConfig.read())


def test_a_right_sized_share_is_the_shards_of_the_last_runs_peak_where_a_gpu_holds_it():
    """``right_size=True`` on a share: the try asks for the shards of ``need`` (the peak x 1.2), else its own share."""
    facts = Cluster("c", "/s", accelerators={"A100": "a100"}, shards={"A100": 4})  # 40 GiB: 10 GiB a shard
    declared = _plan(ResourceSettings(gpu_share="20GiB", accelerator="A100"))
    lines: list[str] = []
    enforced: list[int] = []
    log = logging.getLogger("test_right_sized_share")
    log.addHandler(handler := logging.Handler())
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    log.setLevel(logging.INFO)
    for need, expected, said in (
        (9 * 2**30, "shard:a100:1", "right_size: a share of 9.0 GiB instead of 20.0 GiB"),
        (48 * 2**30, "shard:a100:2", "no GPU the task may run on holds 48.0 GiB: the share stays 20.0 GiB"),
    ):
        request = dataclasses.replace(declared.request, right_size={"need": need})
        plan = dataclasses.replace(declared, request=request, allow_unenforced=True)
        assert gres(plan, facts) == {"gres": expected}
        lines.clear()
        share = job_share(plan, facts, log)
        assert share is not None and any(said in line for line in lines), lines
        enforced.append(share["memory"])
    assert enforced == [9 * 2**30, 20 * 2**30]  # the share each try's runtime caps PyTorch at


def test_options_are_checked_when_the_dag_is_parsed(monkeypatch):
    assert SLURM.parse_options({}).slurm_conn_id == "slurm_default"
    with pytest.raises(InvalidSettingError, match="partition"):
        SLURM.parse_options({"partition": "gpu; rm -rf /"})
    with pytest.raises(UnknownSettingError, match="nodelist"):
        SLURM.parse_options({"nodelist": "n1"})
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_OBJECTS", "partition=gpu, account=*, namespace=ml")
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CLUSTERS", "slurm=slurm_team_a")
    SLURM.parse_options({"partition": "gpu", "account": "anything", "slurm_conn_id": "slurm_team_a"}).permitted("o")
    with pytest.raises(PolicyError, match=r"backend_options\['qos'\]='high'.*allowed_objects lists no qos"):
        SLURM.parse_options({"qos": "high"}).permitted("owner")
    with pytest.raises(PolicyError, match=r"partition=gpu"):
        SLURM.parse_options({"partition": "debug"}).permitted("owner")
    with pytest.raises(
        PolicyError, match=r"'slurm_conn_id'\]='slurm_other'.*slurm_default \(the default\), slurm=slurm_t"
    ):
        SLURM.parse_options({"slurm_conn_id": "slurm_other"}).permitted("owner")
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_OBJECTS", "partition=Debug_1")  # Slurm's names, not DNS ones
    SLURM.parse_options({"partition": "Debug_1"}).permitted("owner")


def test_what_slurm_cannot_run_is_refused_at_parse():
    options = SLURM.parse_options({})
    with pytest.raises(InvalidSettingError, match="Pyxis/enroot, Apptainer"):
        SLURM.check(None, 1, options, ImageSettings(parent_image="nvcr.io/nvidia/pytorch:24.01-py3"))
    with pytest.raises(InvalidSettingError, match="the controller keeps"):
        SLURM.check(None, 1, options, ImageSettings(index_url="https://me:token@pypi.example/simple"))
    with pytest.raises(InvalidSettingError, match="mig_profile"):
        SLURM.check(ResourceSettings(gpu_count=1, mig_profile="1g.10gb"), 1, options)
    with pytest.raises(InvalidSettingError, match="'all' works only"):
        SLURM.check(ResourceSettings(gpu_count="all"), 1, options)
    SLURM.check(ResourceSettings(gpu_count=8), 4, options)  # several machines


def test_resources_become_the_jobs_directives_and_environment():
    plan = _plan(ResourceSettings(gpu_count=2, memory="1.5Gi", cpu_count=2.5, accelerator="A100"), partition="gpu")
    assert plan.directives == {
        "job-name": "airflow-d.t", "partition": "gpu", "mem": "1536M", "cpus-per-task": "3", "requeue": "",
    }  # fmt: skip
    assert plan.gpus == 2 and plan.models == ("A100",) and "CUDA_VISIBLE_DEVICES" not in plan.environment
    assert plan.environment["OMP_NUM_THREADS"] == "3"  # the CPUs --cpus-per-task gives, to one process
    found = directives(plan, CLUSTER, folder="/shared/j", comment="{}", avoid=("n1",))
    assert found["gres"] == "gpu:a100:2" and found["exclude"] == "n1" and found["output"] == "/shared/j/output.log"
    cpu = _plan(ResourceSettings(cpu_count=1), requeue=False)
    assert cpu.environment["CUDA_VISIBLE_DEVICES"] == "" and "no-requeue" in cpu.directives and gres(cpu, CLUSTER) == {}
    nodes = _plan(ResourceSettings(gpu_count=1), nodes=2)
    assert nodes.directives["nodes"] == "2" and nodes.directives["ntasks-per-node"] == "1"
    assert time_limit(61) == {"time": "2"} and time_limit(5) == {"time": "1"} and time_limit(None) == {}


def test_accelerators_map_to_gres_types_and_a_list_to_node_features():
    assert gres(_plan(ResourceSettings(gpu_count=1, accelerator="A100-80GB")), CLUSTER) == {"gres": "gpu:a100:1"}
    either = _plan(ResourceSettings(gpu_count=1, accelerator=["H100-80GB", "A100", "B200"]))
    assert gres(either, CLUSTER) == {"gres": "gpu:1", "constraint": "h100|a100"}  # B200: not on this cluster
    with pytest.raises(GpuTaskError, match=r"'B200' has no GRES type.*maps A100, H100-80GB"):
        gres(_plan(ResourceSettings(gpu_count=1, accelerator="B200")), CLUSTER)


def test_a_share_of_one_gpu_is_the_fewest_gres_shards_that_hold_it():
    facts = Cluster("c", "/s", accelerators={"A100": "a100", "H100": "h100", "L4": "l4"}, shards={"A100": 4, "H100": 4})
    quarter = _plan(ResourceSettings(gpu_count=0.3, accelerator="A100-80GB"))
    assert quarter.gpus == 1 and quarter.share == GpuShare(fraction=0.3)
    assert gres(quarter, facts) == {"gres": "shard:a100:2"}  # 0.3 of 4 shards: 2 (never less than asked)
    assert gres(_plan(ResourceSettings(gpu_share="40GiB", accelerator="H100")), facts) == {"gres": "shard:h100:2"}
    assert gres(_plan(ResourceSettings(gpu_share="100MiB", accelerator="H100")), facts) == {"gres": "shard:h100:1"}
    anywhere = {"gres": "shard:1", "constraint": "a100|h100"}  # no model named: those with shards, as features
    assert gres(_plan(ResourceSettings(gpu_count=0.25)), facts) == anywhere
    with pytest.raises(GpuTaskError, match=r"a different number.*a100: 2 of 4, h100: 1 of 4.*accelerator="):
        shards(GpuShare(memory=16 * 2**30), ("A100", "H100"), facts)  # 16 GiB: 2 of an A100's 4, 1 of an H100's
    with pytest.raises(GpuTaskError, match=r"gives L4 no shards.*\{\"gres\": TYPE, \"shards\": N\}"):
        gres(_plan(ResourceSettings(gpu_count=0.5, accelerator="L4")), facts)
    with pytest.raises(GpuTaskError, match=r"A100 has 40 GiB"):
        gres(_plan(ResourceSettings(gpu_share="48GiB", accelerator="A100")), facts)
    with pytest.raises(InvalidSettingError, match="multi-process launch.*takes whole GPUs"):  # nor across nodes
        AccelerateOperator(task_id="a", script="x.py", backend="slurm", gpu_count=0.5, num_machines=2)
    climbed, _ = OomEscalation().climb(quarter.request.resources, 1, 0)  # the ladder's first step: the whole GPU
    assert (
        gres(_plan(climbed), facts) == {"gres": "gpu:a100:1"} and rest.properties(anywhere, {})[0]["gres"] == "shard:1"
    )


def test_a_share_on_slurm_is_enforced_by_the_one_rule_without_mps(monkeypatch):
    taken = shards(
        GpuShare(fraction=0.25), ("H100",), Cluster("c", "/s", accelerators={"H100": "h100"}, shards={"H100": 4})
    )
    found = enforcement(GpuShare(fraction=0.25), taken, command=False, allow_unenforced=False)
    assert found.kind == "framework" and found.share["fraction"] == 0.25 and found.share["unenforced_allowed"] is False
    assert found.share["line"] == (
        "a share of 0.25 of one h100 GPU (1 of its 4 shards), enforced by PyTorch's cap on its CUDA allocator "
        "(Slurm's gres/shard enforces no memory)"
    )
    with pytest.raises(GpuUnavailableError, match="cannot reach a command.*allow_unenforced_gpu_shares"):
        enforcement(GpuShare(fraction=0.25), taken, command=True, allow_unenforced=False)
    assert enforcement(GpuShare(memory=2**30), taken, command=True, allow_unenforced=True).kind == "none"
    facts = Cluster("c", "/s", accelerators={"A100": "a100"}, shards={"A100": 4})
    assert job_share(_plan(ResourceSettings(gpu_count=1)), facts, LOG) is None
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOW_UNENFORCED_GPU_SHARES", "True")
    share = job_share(_plan(ResourceSettings(gpu_share="1GiB", accelerator="A100")), facts, LOG)
    assert share is not None and share["enforcement"] == "none" and share["memory"] == 2**30  # a command, allowed


def test_the_connections_accelerators_map_gives_shards_per_gpu(monkeypatch):
    extra = {"shared_dir": "/s", "accelerators": {"A100": {"gres": "a100", "shards": 8}, "L4": "l4"}}
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_X", json.dumps({"conn_type": "slurm", "extra": extra}))
    facts = cluster("slurm_x")
    assert facts.accelerators == {"A100": "a100", "L4": "l4"} and facts.shards == {"A100": 8}
    assert facts.shards_of("a100-80gb") == 8 and facts.shards_of("L4") is None
    for bad in ({"A100": {"gres": "a100", "shards": "8"}}, {"A100": {"type": "a100"}}, ["a100"]):
        extra["accelerators"] = bad
        monkeypatch.setenv("AIRFLOW_CONN_SLURM_X", json.dumps({"conn_type": "slurm", "extra": extra}))
        with pytest.raises(GpuTaskError, match=r"'accelerators' maps model names to a GRES type"):
            cluster("slurm_x")


def test_the_batch_script_is_valid_bash_and_checks_the_shared_folder(tmp_path):
    image = ImageSettings(requirements=["tiny==1.0"], find_links=["/wheels"])
    one = batch_script(_plan(ResourceSettings(gpu_count=1), image), "/shared/job-a b", "/opt/py", "/shared/envs")
    several = batch_script(_plan(ResourceSettings(gpu_count=1), nodes=2), "/shared/j", "python3", "/shared/envs")
    for text in (one, several):
        (tmp_path / "job.sh").write_text(text)
        assert subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], check=False).returncode == 0
    assert "cd '/shared/job-a b'" in one and "does not see the job's folder" in one
    assert "runtime.pyz install" in one and "mv -T" in one and "--find-links /wheels" in one
    assert "srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 --gres=gpu:1" in several
    assert "NODE_RANK=$SLURM_NODEID" in several and "$((20000 + SLURM_JOB_ID % 20000))" in several


def test_states_and_exit_codes_are_read_as_slurm_writes_them():
    info = job_info({"job_id": 7, "job_state": "FAILED", "exit_code": 256, "batch_host": "n1", "restart_cnt": 1})
    assert (info.job_id, info.status, info.signal, info.node, info.restarts, info.active) == ("7", 1, 0, "n1", 1, False)
    killed = job_info({"job_id": 8, "job_state": ["TIMEOUT"], "exit_code": 15})
    assert (killed.state, killed.status, killed.signal) == ("TIMEOUT", None, 15)
    assert job_info({"job_id": 9, "job_state": "REQUEUED"}).active  # a requeued job runs again, the same id


def test_slurms_end_states_are_the_failure_classes():
    oom = ended_error(JobInfo("1", "OUT_OF_MEMORY", batch_host="n1"), cancelled_here=False, memory="128M")
    assert isinstance(oom, HostOutOfMemoryError) and "--mem=128M" in str(oom)  # the OOM ladder's next rung
    for state in ("TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL"):
        error = ended_error(JobInfo("1", state, batch_host="n2"), cancelled_here=False, memory=None)
        assert isinstance(error, GpuInfrastructureError) and error.failure["node"] == "n2"
        assert failure_class_of(error)[0] == "infrastructure"  # type: ignore[index]  # GpuRetryPolicy's class
    other = ended_error(JobInfo("1", "CANCELLED"), cancelled_here=False, memory=None)
    assert "cancelled outside this task (scancel by a user or an admin" in str(other)
    assert ended_error(JobInfo("1", "COMPLETED"), cancelled_here=False, memory=None) is None
    assert ended_error(JobInfo("1", "FAILED", status=1), cancelled_here=False, memory=None) is None  # its result says


def test_a_pending_jobs_reason_is_said_in_words():
    assert pending_reason("Resources") == "waits for the resources it asks for (busy now) (Resources)"
    assert "for a limit of its QoS" in pending_reason("QOSMaxGRESPerUser")
    assert "held" in pending_reason("JobHeldUser") and "a job it depends on" in pending_reason("Dependency")
    assert "partition" in pending_reason("PartitionTimeLimit") and pending_reason("") == "waits (no reason given yet)"
    assert never_starts("BadConstraints") and never_starts("DependencyNeverSatisfied") and not never_starts("Resources")


def test_the_next_try_avoids_a_failed_node_only_where_another_fits():
    nodes = [
        {"name": "n1", "partitions": ["gpu"], "gres": "gpu:a100:1,gpu:h100:1", "state": "idle"},
        {"name": "n2", "partitions": ["gpu"], "gres": "gpu:a100:1(S:0)", "state": "idle"},
        {"name": "n3", "partitions": ["cpu"], "gres": "", "state": "idle"},
    ]
    assert fitting_nodes(nodes, "gpu", "gpu:a100:1") == ["n1", "n2"] and fitting_nodes(nodes, None, "gpu:0") == [
        "n1", "n2", "n3",
    ]  # fmt: skip
    a100 = _plan(ResourceSettings(gpu_count=1, accelerator="A100"), avoid=["n1"], partition="gpu")
    assert avoided(a100, nodes, CLUSTER, LOG) == ("n1",)  # n2 has an A100 too
    h100 = _plan(ResourceSettings(gpu_count=1, accelerator="H100-80GB"), avoid=["n1"], partition="gpu")
    assert avoided(h100, nodes, CLUSTER, LOG) == ()  # the only H100: the job waits for n1's return
    down = [{**nodes[0]}, {**nodes[1], "state": "down"}]
    assert avoided(a100, down, CLUSTER, LOG) == ()  # the other A100's node is down
    assert avoided(a100, nodes, dataclasses.replace(CLUSTER, url="http://r:6820"), LOG) == ("n1",)  # slurmrestd's too


def test_the_rest_version_is_discovered_never_assumed():
    assert rest.version(["v0.0.38", "v0.0.37", "v0.0.36"]) == "v0.0.38"
    assert rest.version(["v0.0.37", "v0.0.36"]) == "v0.0.37"
    assert rest.version(["v0.0.38", "v0.0.37"], pinned="v0.0.37") == "v0.0.37"
    with pytest.raises(GpuTaskError, match=r"serves the REST API versions v0.0.40, v0.0.39.*supports v0.0.38, v0.0.37"):
        rest.version(["v0.0.40", "v0.0.39"])
    with pytest.raises(GpuTaskError, match="pins api_version 'v0.0.36'"):
        rest.version(["v0.0.38", "v0.0.36"], pinned="v0.0.36")
    job, dropped = rest.properties({"mem": "1536M", "nodes": "2", "no-requeue": "", "exclude": "n1"}, {"A": "1"})
    assert job == {
        "environment": {"A": "1"}, "memory_per_node": 1536, "nodes": [2, 2], "requeue": False, "exclude_nodes": "n1"
    }  # fmt: skip
    assert dropped == []


def test_a_jobs_comment_names_its_task_instance_and_a_record_only_its_job():
    text = orphans.comment(LABELS, durable=True)
    assert orphans.marks(text)["durable"] == "true" and orphans.mine(text, LABELS)  # type: ignore[index]
    assert not orphans.mine(text, {**LABELS, "run_id": "other"}) and orphans.marks("a user's comment") is None
    assert orphans.mine(text, {**LABELS, "try_number": "3"})  # the task instance's next try takes it over
    record, store = JobRecord("k", "Slurm job", "cluster", valid_id=str.isdigit), _Store()
    record.record(store, "12", "c", "1", folder="/f")
    assert record.recorded(store, "c") == {"id": "12", "cluster": "c", "try": "1", "folder": "/f"}
    assert record.recorded(store, "other") is None and record.checked({"id": "../x", "cluster": "c"}, "c") is None
    record.forget(store, "13")  # another job's forget leaves this one's record
    assert record.recorded(store, "c") is not None
    record.forget(store, "12")
    assert record.recorded(store, "c") is None


class _Store(dict):
    """A task state store's interface over a dict (Airflow's own is an API client of the metadata DB)."""

    def set(self, key, value):
        self[key] = value

    def get(self, key, default=None):
        return super().get(key, default)

    def delete(self, key):
        self.pop(key, None)


async def _events(trigger: SlurmJobTrigger, snapshots: list[dict[str, JobInfo]]) -> list[dict]:
    async def stream():
        for snapshot in snapshots:
            yield snapshot

    return [event.payload async for event in trigger.filter_shared_stream(stream())]


def test_the_trigger_decides_from_the_clusters_snapshots():
    where, ours = {"slurm_conn_id": "c"}, orphans.comment(LABELS, durable=True)
    pending, running = JobInfo("5", "PENDING", reason="Resources", comment=ours), JobInfo("5", "RUNNING", comment=ours)
    ended = [{"5": pending}, {"5": running}, {"5": JobInfo("5", "COMPLETED", comment=ours)}, {}]
    [event] = asyncio.run(_events(SlurmJobTrigger("5", where, state={"s": 1}), ended))
    assert event["status"] == "ended" and event["job_state"] == "COMPLETED" and event["state"]["backend"] == {"s": 1}
    # a trigger row naming another deployment's (or no provider's) job watches nothing
    theirs = JobInfo("5", "RUNNING", comment=ours.replace('"deployment":"', '"deployment":"other-'))
    for job in (theirs, JobInfo("5", "RUNNING")):
        assert asyncio.run(_events(SlurmJobTrigger("5", where), [{"5": job}]))[0]["status"] == "refused"
    assert asyncio.run(_events(SlurmJobTrigger("5", where), [{"6": running}]))[0]["status"] == "missing"
    late = SlurmJobTrigger("5", where, pending_deadline=1.0)  # long past: a job still waiting is missing its GPUs
    assert asyncio.run(_events(late, [{"5": running}, {"5": pending}]))[0]["status"] == "pending"
    timed_out = SlurmJobTrigger("5", where, deadline=1.0)
    assert asyncio.run(_events(timed_out, [{"5": running}]))[0]["status"] == "timeout"
    assert late.shared_stream_key() == timed_out.shared_stream_key()  # one query for both: the same cluster
