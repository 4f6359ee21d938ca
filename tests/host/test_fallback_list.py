"""A fallback list of models on a host (local and Docker): the first model with enough free GPUs, never a mix.

The host's GPUs are listed in ``[gpu] devices`` with their models, as on a host without NVML; the locks are real
flocks, held by this process.
"""

from __future__ import annotations

import logging

import pytest

from airflow_gpu_provider.exceptions import GpuUnavailableError
from airflow_gpu_provider.host.allocator import HostGpus
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

LISTED = "0=L4,1=A100-80GB,2=A100-80GB,3=H100"
log = logging.getLogger("test")


def _request(accelerator, count=1, policy="fail"):
    resources = ResourceSettings(accelerator=accelerator, gpu_count=count)
    return TaskRequest(resources, ImageSettings(), Envelope.run(["true"]), policy)


def _ids(allocation):
    return [d.id for d in allocation.devices]


def test_the_first_model_of_the_list_with_a_free_gpu_is_taken(tmp_path):
    host = HostGpus(devices=LISTED, state_dir=str(tmp_path))
    wanted = ["H100", "A100-80GB"]
    with host.allocate(_request(wanted), backend="test", log=log) as first:
        assert _ids(first) == ["3"]  # the H100, preferred
        with host.allocate(_request(wanted), backend="test", log=log) as second:
            assert _ids(second) == ["1"]  # the H100 is held: the next model of the list
            with host.allocate(_request(wanted), backend="test", log=log) as third:
                assert _ids(third) == ["2"]
                with pytest.raises(GpuUnavailableError, match="held by"):  # the L4 is not on the list
                    host.allocate(_request(wanted), backend="test", log=log)
    with host.allocate(_request(wanted), backend="test", log=log) as again:  # all released: the H100 again
        assert _ids(again) == ["3"]


def test_a_count_is_met_by_one_model_never_a_mix(tmp_path):
    host = HostGpus(devices=LISTED, state_dir=str(tmp_path))
    with host.allocate(_request(["H100", "A100-80GB"], count=2), backend="test", log=log) as both:
        assert _ids(both) == ["1", "2"]  # one H100 cannot give two: both A100s
    with host.allocate(_request("A100-80GB"), backend="test", log=log) as held:
        assert _ids(held) == ["1"]
        with pytest.raises(GpuUnavailableError) as info:  # one A100 and one H100 free: no single model has two
            host.allocate(_request(["H100", "A100-80GB"], count=2), backend="test", log=log)
        assert "free: 2, 3" in str(info.value)


def test_the_order_of_the_list_is_the_preference(tmp_path):
    host = HostGpus(devices=LISTED, state_dir=str(tmp_path))
    with host.allocate(_request(["A100-80GB", "H100"]), backend="test", log=log) as first:
        assert _ids(first) == ["1"]
    with host.allocate(_request(["L4", "H100"]), backend="test", log=log) as first:
        assert _ids(first) == ["0"]


def test_a_host_with_too_few_of_every_model_is_never_told_to_wait(tmp_path):
    """Three GPUs of the list exist, but no model has three: waiting cannot help."""
    host = HostGpus(devices=LISTED, state_dir=str(tmp_path))
    with pytest.raises(GpuUnavailableError) as info:
        host.allocate(_request(["H100", "A100-80GB"], count=3, policy="wait"), backend="test", log=log)
    assert "Waiting cannot help" in str(info.value)


def test_the_cpu_policy_falls_back_when_no_model_of_the_list_is_free(tmp_path):
    host = HostGpus(devices="0=L4", state_dir=str(tmp_path))
    allocation = host.allocate(_request(["H100", "A100-80GB"], policy="cpu"), backend="test", log=log)
    assert allocation.cpu_fallback and allocation.devices == []


@pytest.mark.usefixtures("airflow_home")
def test_a_local_task_runs_on_the_first_free_model_of_its_list(monkeypatch, state_dir):
    """Through real Airflow (dag.test) and a real child process: the H100, then the A100 while the H100 is held."""
    from conftest import REPO
    from helpers import load_dag, run_dag, xcom

    from airflow_gpu_provider.host.allocator import GpuAllocator
    from airflow_gpu_provider.host.inventory import Device

    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", LISTED)
    dag = load_dag(REPO / "tests" / "dags" / "fallback_list_dag.py", "fallback_list")
    assert xcom(run_dag(dag), "train") == {"cuda": "3"}
    held = GpuAllocator(state_dir / "locks").try_acquire([Device("3")], 1, "the test")
    assert held is not None
    with held:
        assert xcom(run_dag(dag), "train") == {"cuda": "1"}
