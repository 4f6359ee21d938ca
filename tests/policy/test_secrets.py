"""M4: credentials in checkpoint URIs and index URLs reach no log, rendered field or import error."""

from __future__ import annotations

import logging

from conftest import REPO
from helpers import load_dag, run_dag, task_states

from airflow_gpu_provider.checkpoint.cleanup import remove_run_folder
from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.secrets import credentials

SECRET = "s3cr3tKeyValue42"
ROOT = f"s3://AKIAEXAMPLE:{SECRET}@ml-bucket/ckpt"


def test_credentials_of_urls_are_found():
    assert credentials(f"{ROOT} and https://token1234@pypi.example/simple") == [
        f"AKIAEXAMPLE:{SECRET}", SECRET, "token1234", "token1234",
    ]  # fmt: skip
    assert credentials("s3://bucket/no/keys https://host/simple") == []


def test_a_mistyped_index_url_with_a_token_never_reaches_the_import_error(tmp_path, airflow_home):
    dag_file = tmp_path / "bad_index.py"
    dag_file.write_text(
        "from airflow.sdk import DAG\nfrom airflow_gpu_provider import ImageSettings, gpu_task\n"
        "with DAG('bad_index', schedule=None):\n"
        f"    gpu_task(image=ImageSettings(index_url='https://me:{SECRET}@pypi.example/simple '))(lambda: 1)()\n"
    )
    from airflow.dag_processing.dagbag import DagBag

    errors = DagBag(dag_folder=str(dag_file)).import_errors
    assert errors and "white space" in str(errors) and SECRET not in str(errors)
    text = "".join(errors.values())
    assert f"{dag_file}:4: ImageSettings: index_url='https://***@" in text  # its line is named, its source is not shown


def test_a_keyed_checkpoint_uri_reaches_no_log_and_no_rendered_field(airflow_home, monkeypatch, capfd):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", ROOT)
    monkeypatch.setenv("AIRFLOW__GPU__CHECKPOINT_CLEANUP", "False")
    dr = run_dag(load_dag(REPO / "tests" / "dags" / "checkpoint_dags.py", "checkpoint_credentials"), {"root": ROOT})
    assert task_states(dr) == {"keyed": "success"}
    out = capfd.readouterr()
    assert "my folder:" in out.out + out.err and SECRET not in out.out + out.err  # the task's own print too
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.utils.session import create_session

    with create_session() as session:
        (ti,) = dr.get_task_instances(session=session)
        rendered = RenderedTaskInstanceFields.get_templated_fields(ti, session=session)
    assert rendered["checkpoint"] and SECRET not in str(rendered)


def test_the_schedulers_cleanup_names_no_key(caplog):
    with caplog.at_level(logging.WARNING):
        remove_run_folder(ROOT, "d", "r", Policy.current())  # not an allowed root here: skipped, and said so
    assert "skips" in caplog.text and SECRET not in caplog.text
