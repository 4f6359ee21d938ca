"""The failure matrix as tests: each cell ends as it should and leaves nothing behind (see matrix.py).

``make reliability`` runs only these and writes the table to docs/reliability.md.
"""

from __future__ import annotations

import pytest
from reliability.matrix import BACKENDS, cells, describe_failure, run_cell

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("airflow_home")]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("matrix")


@pytest.mark.parametrize(("backend", "scenario"), cells(BACKENDS), ids=lambda value: value.replace(" ", "-"))
def test_cell(backend, scenario, work, matrix_results, request):
    if backend == "ray":
        request.getfixturevalue("ray_cluster_address")  # the tests' Ray cluster, or skip without ray (fail in CI)
    elif backend != "local":
        request.getfixturevalue("docker_client")  # the engine and the base image, or skip (fail in CI)
    cell = run_cell(backend, scenario, work)
    matrix_results.append(cell)
    if not cell.ran:
        pytest.skip(f"not run here: {cell.note}")
    assert cell.ok, describe_failure(cell)
