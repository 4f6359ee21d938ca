"""The failure matrix as tests: each cell ends as it should and leaves nothing behind (see matrix.py).

``make reliability`` runs only these and writes the table to docs/reliability.md. The selected cells run in lanes
(``lanes.py``: a local, a Docker, a Ray and a Slurm cell at a time) from the first test on; each test waits for its own cell.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability.lanes import Lanes
from reliability.matrix import BACKENDS, cells, describe_failure
from reliability.places import Setup

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("airflow_home")]


def _needs(backend: str) -> str | None:
    """The fixture a backend's cells need: the tests' Ray or Slurm cluster, or the engine and the base image (each
    skips without, and fails in CI)."""
    return {"local": None, "ray": "ray_cluster_address", "slurm": "slurm_session"}.get(backend, "docker_client")


def _database() -> Path:
    from airflow.configuration import conf

    url = conf.get("database", "sql_alchemy_conn")
    assert url.startswith("sqlite:///"), f"the matrix copies the tests' SQLite DB; this one is {url}"
    return Path(url.removeprefix("sqlite:///"))


@pytest.fixture(scope="module")
def lanes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lanes]:
    """The selected cells, running in their lanes: the Ray cells once the Ray cluster runs, the others meanwhile."""
    selected = [
        (item.callspec.params["backend"], item.callspec.params["scenario"])
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.module is request.module and hasattr(item, "callspec")
    ]
    backends = list(dict.fromkeys(backend for backend, _ in selected))
    # the environment is read before the Ray fixture sets its variables: the lanes' threads read it meanwhile
    running = Lanes(Setup(tmp_path_factory.mktemp("matrix"), dict(os.environ), _database()))
    try:
        clusters = ("ray", "slurm")
        for group in ([b for b in backends if b not in clusters], *([b for b in backends if b == c] for c in clusters)):
            for backend in group:
                fixture = _needs(backend)
                try:
                    if fixture is not None:
                        found = request.getfixturevalue(fixture)
                except (pytest.skip.Exception, pytest.fail.Exception, Exception) as problem:
                    running.missing[backend] = problem
            if "ray" in group:
                running.setup.ray_address = os.environ.get("AIRFLOW_GPU_TEST_RAY_ADDRESS", "")
                running.setup.ray_connection = os.environ.get("AIRFLOW_CONN_RAY_DEFAULT", "")
            if "slurm" in group and "slurm" not in running.missing:
                cluster, variables = found
                running.setup.slurm_conf = str(cluster.conf)
                running.setup.slurm_environment = {"AIRFLOW_CONN_SLURM_DEFAULT": variables["AIRFLOW_CONN_SLURM_TEST"]}
            running.start([(b, s) for b, s in selected if b in group and b not in running.missing])
        yield running
    finally:
        running.close()


@pytest.mark.parametrize(("backend", "scenario"), cells(BACKENDS), ids=lambda value: value.replace(" ", "-"))
def test_cell(backend, scenario, lanes, matrix_results):
    problem = lanes.missing.get(backend)
    if isinstance(problem, pytest.skip.Exception):
        pytest.skip(problem.msg)
    if problem is not None:
        pytest.fail(f"{_needs(backend)}: {problem}", pytrace=False)
    cell = lanes.result(backend, scenario)
    matrix_results.append(cell)
    if not cell.ran:
        pytest.skip(f"not run here: {cell.note}")
    assert cell.ok, describe_failure(cell)
