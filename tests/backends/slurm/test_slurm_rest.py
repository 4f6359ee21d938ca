"""slurmrestd takes what the CLI path submits, node avoidance included (its v0.0.37 and v0.0.38 APIs).

The decision of which nodes a try avoids is ``placement.avoided`` (test_slurm_plan.py); here the real daemon runs
the job elsewhere.
"""

from __future__ import annotations

import time

import pytest

from airflow_gpu_provider.backends.slurm.connection import cluster
from airflow_gpu_provider.backends.slurm.rest import RestClient

pytestmark = pytest.mark.usefixtures("airflow_home")


@pytest.mark.parametrize("api_version", ["v0.0.38", "v0.0.37"])
def test_a_job_submitted_through_slurmrestd_avoids_the_node_an_earlier_try_failed_on(
    slurm, tmp_path, monkeypatch, api_version
):
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_PINNED", slurm.connection(rest=True, api_version=api_version))
    client = RestClient(cluster("slurm_pinned"))
    assert sorted(str(node["name"]) for node in client.nodes()) == sorted(slurm.nodes)  # what avoided() is given
    assert client.version == api_version
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    for failed in slurm.nodes:
        job_id = client.submit(str(script), {"exclude": failed, "nodes": "1", "chdir": "/tmp"}, {"PATH": "/bin"})
        deadline = time.monotonic() + 30
        while (info := client.job(job_id)) is not None and info.active and time.monotonic() < deadline:
            time.sleep(0.1)
        assert info is not None and info.state == "COMPLETED", info
        assert info.nodes in slurm.nodes and info.nodes != failed, info
