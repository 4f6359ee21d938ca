"""Project code next to the DAG file: imported from the DAG's folder on the local backend, shipped with ``modules=``
(into a Docker container for real), and refused at parse when missing, too large, or behind a link (rule F4).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from conftest import REPO
from helpers import load_dag, run_dag, task_states, xcom
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.policy.modules import MAX_BYTES
from airflow_gpu_provider.task.modules import ProjectModules, project_folders, python_path

DAG_FILE = REPO / "tests" / "dags" / "project_dags.py"
DAGS = REPO / "tests" / "dags"


def test_a_task_imports_modules_next_to_its_dag_file_on_the_local_backend(airflow_home):
    dag_run = run_dag(load_dag(DAG_FILE, "project_modules_local"))
    assert task_states(dag_run) == {"from_the_dag_folder": "success", "shipped": "success"}
    plain = xcom(dag_run, "from_the_dag_folder")
    assert plain["double"] == 42 and plain["layers"] == "layers of plpkg" and plain["child"] == "8"
    assert plain["plmod_file"] == str(DAGS / "plmod.py")  # the DAG's own folder, as the worker has it
    shipped = xcom(dag_run, "shipped")
    assert shipped["double"] == 42 and shipped["child"] == "8"
    # modules= ships them on every backend: the unpacked copy comes first, also in a process the task starts
    assert "/airflow-gpu-modules-" in shipped["plmod_file"]
    assert shipped["layers_file"].endswith("/plpkg/layers.py") and "/airflow-gpu-modules-" in shipped["layers_file"]


@pytest.mark.docker
@pytest.mark.usefixtures("no_leaks")
def test_modules_are_shipped_into_a_docker_container(airflow_home, capfd):
    dag_run = run_dag(load_dag(DAG_FILE, "project_modules_docker"))
    assert task_states(dag_run) == {"shipped": "success"}
    value = xcom(dag_run, "shipped")
    assert value["double"] == 42 and value["layers"] == "layers of plpkg" and value["child"] == "8"
    assert "/airflow-gpu-modules-" in value["plmod_file"]  # unpacked inside the container
    assert not value["plmod_file"].startswith(str(REPO))
    out = capfd.readouterr().out
    digest = ProjectModules(("plmod", "plpkg"), (str(DAGS),)).shipped("t")["sha256"][:12]
    assert f"[gpu] project modules plmod, plpkg (sha256 {digest}) first on the path:" in out


@pytest.mark.docker
def test_a_pod_gets_the_modules_in_a_variable_of_their_own_and_imports_them(airflow_home):
    """The pod rendered for Kubernetes, its container run in Docker: the archive comes in AIRFLOW_GPU_MODULES."""
    import base64
    import json
    import sys

    sys.path.insert(0, str(REPO / "tests" / "backends" / "kubernetes"))
    from pod_in_docker import run_pod

    objects = load_dag(DAG_FILE, "project_modules_kubernetes").get_task("shipped").render_manifests()
    secret, pod = objects  # the envelope is in the task's Secret
    variables = {v["name"]: v.get("value") for v in pod["spec"]["containers"][0]["env"]}
    envelope = json.loads(base64.b64decode(base64.b64decode(secret["data"]["envelope"])))
    assert envelope["modules"]["zip"] == "env:AIRFLOW_GPU_MODULES" and variables["AIRFLOW_GPU_MODULES"]
    run = run_pod(objects)
    assert run.exit_codes == {"base": 0}, run.logs
    assert run.result is not None and run.result["ok"], run.logs
    value = run.result["return_value"]
    assert value["double"] == 42 and value["child"] == "8" and value["layers"] == "layers of plpkg"


def test_the_archive_is_the_same_for_the_same_files():
    modules = ProjectModules(("plpkg", "plmod"), (str(DAGS),))
    first, second = modules.shipped("t"), modules.shipped("t")
    assert first == second and first["names"] == ["plpkg", "plmod"]


def test_project_folders_and_python_path(tmp_path):
    dag_file = str(tmp_path / "team" / "train.py")
    assert project_folders(dag_file, str(tmp_path)) == (str(tmp_path / "team"), str(tmp_path))
    assert project_folders(dag_file, str(tmp_path / "team")) == (str(tmp_path / "team"),)
    assert project_folders(None) == () and project_folders("relative.py") == ()
    assert python_path(["/a", "/b"], f"/c{os.pathsep}/a") == {"PYTHONPATH": f"/a{os.pathsep}/b{os.pathsep}/c"}
    assert python_path([], "/c") == {}


def _dag(folder: Path, modules: str) -> Path:
    dag = folder / "bad_modules.py"
    dag.write_text(
        textwrap.dedent(f"""
        import datetime
        from airflow.sdk import DAG
        from airflow_gpu_provider import gpu_task

        def work():
            return 1

        with DAG("bad_modules", schedule=None, start_date=datetime.datetime(2024, 1, 1)):
            gpu_task(task_id="work", modules={modules})(work)()
        """)
    )
    return dag


def _import_error(dag: Path) -> str:
    from airflow.dag_processing.dagbag import DagBag

    errors = DagBag(dag_folder=str(dag)).import_errors
    assert len(errors) == 1, errors
    return next(iter(errors.values()))


@pytest.mark.parametrize(
    ("modules", "wanted"),
    [
        ("['missing']", "modules='missing' is invalid: no missing.py nor missing/ in "),
        ("['../outside']", "modules='../outside' is invalid: not the name of a top-level module or package"),
        ("['pkg.sub']", "modules='pkg.sub' is invalid: not the name of a top-level module or package"),
        ("'plmod'", "modules='plmod' is invalid: expected a list of module names"),
    ],
)
def test_bad_module_names_are_parse_errors_naming_the_field(tmp_path, modules, wanted):
    error = _import_error(_dag(tmp_path, modules))
    assert "@task.gpu('work'): " + wanted in error, error
    assert "Accepted: names of modules (plmod.py) or packages (mypkg/)" in error


def test_a_link_out_of_the_bundle_is_refused_at_parse(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.py").write_text("TOKEN = 'x'\n")
    bundle = tmp_path / "bundle"
    (bundle / "pkg").mkdir(parents=True)
    (bundle / "pkg" / "__init__.py").write_text("")
    (bundle / "pkg" / "secret.py").symlink_to(outside / "secret.py")  # a file of the package is a link
    (bundle / "linked.py").symlink_to(outside / "secret.py")  # the module itself is a link
    (bundle / "linked_dir").symlink_to(outside)  # a package folder that is a link
    for name, where in (("pkg", "pkg/secret.py"), ("linked", "linked.py"), ("linked_dir", "linked_dir")):
        error = _import_error(_dag(bundle, repr([name])))
        assert f"modules={name!r} is invalid: {bundle}/{where}: it is a symbolic link: links are not followed" in error
        assert "(rule F4)" in error


def test_too_large_modules_are_refused_at_parse(tmp_path):
    (tmp_path / "big.py").write_text("X = 1\n" + "#" * MAX_BYTES)
    error = _import_error(_dag(tmp_path, "['big']"))
    assert "@task.gpu('work'): modules=['big'] is invalid: they take more than 256 KiB or 512 files" in error
    assert "bake larger code into the image" in error


def test_settle_checks_without_reading_and_skips_caches(tmp_path):
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("A = 1\n")
    (tmp_path / "pkg" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0" * (MAX_BYTES + 1))
    (tmp_path / "pkg" / ".hidden").write_text("no")
    modules = ProjectModules.settle("t", ["pkg"], str(tmp_path / "dag.py"))
    assert modules is not None and modules.files("t") == {"pkg/__init__.py": b"A = 1\n"}
    assert ProjectModules.settle("t", [], str(tmp_path / "dag.py")) is None
    with pytest.raises(InvalidSettingError, match="the DAG file is not known"):
        ProjectModules.settle("t", ["pkg"], None)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.none(),
        st.text(max_size=20),
        st.lists(st.one_of(st.sampled_from(["plmod", "plpkg", "tiny_lightning"]), st.text(max_size=12), st.integers())),
        st.integers(),
        st.dictionaries(st.text(max_size=4), st.text(max_size=4)),
    )
)
def test_any_modules_value_is_accepted_or_names_the_field(value):
    try:
        modules = ProjectModules.settle("@task.gpu('t')", value, str(DAGS / "project_dags.py"))
    except InvalidSettingError as err:
        assert err.field == "modules" and str(err).startswith("@task.gpu('t'): modules=")
        return
    assert modules is None or all((DAGS / f"{n}.py").is_file() or (DAGS / n).is_dir() for n in modules.names)


def test_a_fifo_in_a_package_is_refused_without_being_opened(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    os.mkfifo(tmp_path / "pkg" / "pipe")  # opening it for reading would block
    os.mkfifo(tmp_path / "fifo.py")
    for name, where in (("pkg", "pkg/pipe"), ("fifo", "fifo.py")):
        with pytest.raises(
            InvalidSettingError, match=rf"{tmp_path}/{where}: it is (neither a folder nor )?(not )?a regular file"
        ):
            ProjectModules.settle("t", [name], str(tmp_path / "dag.py"))


@pytest.mark.parametrize(
    ("task", "owner"),
    [
        ("gpu_task(task_id='work', modules=['missing'])(work).expand(x=[1, 2])", "@task.gpu('work')"),
        (
            "GpuStepOperator.partial(task_id='work', python_callable=work, modules=['missing']).expand(op_args=[[1]])",
            "GpuStepOperator('work')",
        ),
    ],
)
def test_a_mapped_tasks_modules_are_checked_at_parse(tmp_path, task, owner):
    dag = tmp_path / "mapped_modules.py"
    dag.write_text(
        textwrap.dedent(f"""
        import datetime
        from airflow.sdk import DAG
        from airflow_gpu_provider import GpuStepOperator, gpu_task

        def work(x):
            return x

        with DAG("mapped_modules", schedule=None, start_date=datetime.datetime(2024, 1, 1)):
            {task}
        """)
    )
    assert f"{owner}: modules='missing' is invalid: no missing.py nor missing/ in" in _import_error(dag)
