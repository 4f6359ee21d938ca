"""Provider registration as Airflow itself sees it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import airflow
import jsonschema
import pytest
from conftest import REPO

from airflow_gpu_provider import config
from airflow_gpu_provider.config import OPTIONS
from airflow_gpu_provider.get_provider_info import get_provider_info

AIRFLOW_BIN = Path(sys.executable).with_name("airflow")
pytestmark = pytest.mark.smoke  # also on the oldest supported Airflow


def test_provider_info_is_valid_against_airflows_schema():
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == "airflow-gpu-provider"
    assert info["task-decorators"] == [{"name": "gpu", "class-name": "airflow_gpu_provider.decorators.gpu.gpu_task"}]


def test_config_section_documents_every_option():
    options = get_provider_info()["config"]["gpu"]["options"]
    assert set(options) == {o.name for o in OPTIONS}
    assert {"backend", "on_missing_gpu", "pool", "state_dir", "devices"} <= set(options)
    for option in options.values():
        assert len(option["description"]) > 30


def test_entry_points_are_registered():
    providers = {ep.value for ep in entry_points(group="apache_airflow_provider")}
    plugins = {ep.value for ep in entry_points(group="airflow.plugins")}
    assert "airflow_gpu_provider.get_provider_info:get_provider_info" in providers
    assert "airflow_gpu_provider.plugin:GpuProviderPlugin" in plugins


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["providers", "list"], "airflow-gpu-provider"),
        # JSON: the table's columns are cut to the terminal's width, more so with every plugin installed
        (["plugins", "--output", "json"], '"airflow_gpu_provider.checkpoint.cleanup"'),
        (["config", "get-value", "gpu", "backend"], "local"),
    ],
)
def test_airflow_cli_shows_the_provider(command, expected):
    out = subprocess.run(
        [str(AIRFLOW_BIN), *command], capture_output=True, text=True, check=True, env=os.environ.copy()
    ).stdout
    assert expected in out


def test_gpu_options_can_be_set_by_environment(monkeypatch):
    from airflow_gpu_provider import config

    monkeypatch.setenv("AIRFLOW__GPU__BACKEND", "docker")
    monkeypatch.setenv("AIRFLOW__GPU__POLL_INTERVAL", "0.5")
    assert config.get("backend") == "docker"
    assert config.get("poll_interval") == 0.5


@pytest.mark.parametrize(
    ("old", "text", "new", "value"),
    [
        ("wait_poll_interval", "2.5", "poll_interval", 2.5),
        ("trigger_poll_interval", "0.75", "poll_interval", 0.75),
        ("profile", "False", "profile_interval", 0.0),
    ],
)
def test_a_removed_gpu_option_still_works_for_one_release_and_warns_naming_its_replacement(
    monkeypatch, old, text, new, value
):
    """Issue 37: ``[gpu]`` shrinks; each removed option is one entry of ``config.MOVED``."""
    from airflow.exceptions import AirflowProviderDeprecationWarning

    from airflow_gpu_provider import config

    monkeypatch.delenv(f"AIRFLOW__GPU__{new.upper()}", raising=False)
    monkeypatch.setenv(f"AIRFLOW__GPU__{old.upper()}", text)
    with pytest.warns(AirflowProviderDeprecationWarning, match=rf"\[gpu\] {old} is deprecated .* set \[gpu\] {new}"):
        assert config.get(new) == value
    monkeypatch.setenv(f"AIRFLOW__GPU__{new.upper()}", "3.0")  # the new name, once set, wins
    assert config.get(new) == 3.0


@pytest.mark.parametrize("old", sorted(name for name, moved in config.MOVED.items() if moved.option is None))
def test_an_option_moved_into_a_connection_is_read_for_one_release_and_warns_naming_the_extra(monkeypatch, old):
    """Issue 37: ``[gpu]`` keeps at most 20 options; one moved to a connection's extra is read where that extra is
    (the backends' tests show each one), with a warning naming the connection and the extra."""
    from airflow.exceptions import AirflowProviderDeprecationWarning

    assert len(config.OPTIONS) <= 20 and old not in {option.name for option in config.OPTIONS}
    monkeypatch.setenv(f"AIRFLOW__GPU__{old.upper()}", "x")
    replacement = config.MOVED[old].replacement
    assert re.fullmatch(r"the (Docker|Kubernetes|Docker or Kubernetes) connection's extra [a-z_]+", replacement)
    with pytest.warns(AirflowProviderDeprecationWarning, match=rf"\[gpu\] {old} is deprecated .* set {replacement}"):
        assert config.deprecated(old) == "x"


def test_the_configuration_page_shows_the_options_table_and_the_removed_options_as_generated():
    """docs/configuration.md's ``[gpu]`` tables are ``config.OPTIONS`` and ``config.MOVED``: edit those, then run
    scripts/config_docs.py. Each option has a one-line meaning, and the page names every option and old name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("config_docs", REPO / "scripts" / "config_docs.py")
    assert spec is not None and spec.loader is not None
    config_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(config_docs)
    page = config_docs.PAGE.read_text()
    assert config_docs.render(page) == page, "docs/configuration.md is stale: run scripts/config_docs.py"
    assert config_docs.main(["--check"]) == 0
    assert all(option.short for option in config.OPTIONS)
    for name in [*(option.name for option in config.OPTIONS), *config.MOVED]:
        assert f"| `{name}` |" in page or f"`{name}`, " in page or f", `{name}` |" in page, name


def test_profile_interval_has_a_floor_that_keeps_telemetry_off_the_tasks_back(monkeypatch):
    """Each sample takes the GPU driver's lock, which the task's CUDA calls wait for: 0.05 s is refused, saying why."""
    from airflow_gpu_provider import config

    monkeypatch.setenv("AIRFLOW__GPU__PROFILE_INTERVAL", "0.05")
    with pytest.raises(ValueError, match=r"profile_interval='0.05' is below 0.25 s: every sample takes the GPU driver"):
        config.get("profile_interval")
    monkeypatch.setenv("AIRFLOW__GPU__PROFILE_INTERVAL", "0.25")
    assert config.get("profile_interval") == 0.25
    monkeypatch.setenv("AIRFLOW__GPU__PROFILE_INTERVAL", "0")  # off (was [gpu] profile = False)
    assert config.get("profile_interval") == 0.0


def test_the_policy_section_is_declared_and_read_by_one_reader_for_airflow_and_the_plugin(monkeypatch):
    """``[gpu_policy]`` is the provider's own section; Airflow's processes and the plugin's root-owned file give the
    same values through the same reader (``config/policy.py``)."""
    import shutil

    from backends.docker.authz_engine import root_folder

    from airflow_gpu_provider import config
    from airflow_gpu_provider.config.policy import POLICY_OPTIONS
    from airflow_gpu_provider.policy.authz.settings import load

    declared = get_provider_info()["config"]["gpu_policy"]["options"]
    assert set(declared) == {o.name for o in POLICY_OPTIONS} and "allowed_clusters" in declared
    values = {"allowed_volumes": "hf-cache, data%1", "allowed_clusters": "docker=tcp://gpu-host:2376",
              "deployment": "ml-prod", "min_pod_security": "baseline"}  # fmt: skip
    for option in POLICY_OPTIONS:  # only these, as the file has only these
        monkeypatch.delenv(f"AIRFLOW__GPU_POLICY__{option.name.upper()}", raising=False)
    for name, value in values.items():
        monkeypatch.setenv(f"AIRFLOW__GPU_POLICY__{name.upper()}", value)
    folder = root_folder()
    try:
        (folder / "policy.cfg").write_text(
            "[gpu_policy]\n" + "".join(f"{k} = {v.replace('%', '%%')}\n" for k, v in values.items())
        )
        plugin = vars(load(str(folder / "policy.cfg"), os.geteuid()))
    finally:
        shutil.rmtree(folder)
    airflow_side = config.policy_values()
    assert {k: plugin[k] for k in airflow_side} == airflow_side and airflow_side[
        "allowed_volumes"
    ] == "hf-cache, data%1"


def test_an_old_gpu_name_of_an_allow_list_is_read_one_more_release_with_a_warning(monkeypatch):
    from airflow.exceptions import AirflowProviderDeprecationWarning

    from airflow_gpu_provider import config

    for name in ("ALLOWED_VOLUMES", "ALLOWED_CLUSTERS"):  # a cluster fixture of this session may have set them
        monkeypatch.delenv(f"AIRFLOW__GPU_POLICY__{name}", raising=False)
    monkeypatch.setenv("AIRFLOW__GPU__ALLOWED_VOLUMES", "hf-cache")
    monkeypatch.setenv("AIRFLOW__GPU__ALLOWED_DOCKER_ENGINES", "tcp://a:2376, unix:///run/user/1/docker.sock")
    with pytest.warns(AirflowProviderDeprecationWarning, match=r"\[gpu\] allowed_docker_engines is deprecated .* "
                      r"set \[gpu_policy\] allowed_clusters instead"):  # fmt: skip
        values = config.policy_values()
    assert values["allowed_volumes"] == "hf-cache"
    assert values["allowed_clusters"] == "docker=tcp://a:2376, docker=unix:///run/user/1/docker.sock"
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_VOLUMES", "datasets")
    with pytest.warns(AirflowProviderDeprecationWarning, match=r"\[gpu\] allowed_volumes is ignored"):
        assert config.policy_values()["allowed_volumes"] == "datasets"


def test_allowing_unenforced_gpu_shares_is_the_admins_policy(monkeypatch):
    """``allow_unenforced_gpu_shares`` is a ``[gpu_policy]`` boolean (new in 0.2.0: no ``[gpu]`` name is read)."""
    from airflow_gpu_provider.config.worker import GpuConfig

    monkeypatch.setenv("AIRFLOW__GPU__ALLOW_UNENFORCED_GPU_SHARES", "True")
    assert GpuConfig.read().allow_unenforced_gpu_shares is False
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOW_UNENFORCED_GPU_SHARES", "true")
    assert GpuConfig.read().allow_unenforced_gpu_shares is True
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOW_UNENFORCED_GPU_SHARES", "yes")
    with pytest.raises(ValueError, match=r"\[gpu_policy\] allow_unenforced_gpu_shares='yes' is not a boolean"):
        GpuConfig.read()


def test_the_description_the_trigger_form_and_the_triggers_follow_the_registry():
    """``airflow providers list`` named three backends of five, the form's ``backend`` described three (issue 36)."""
    from airflow_gpu_provider.backends import BACKENDS, RUN_TIME_NAMES
    from airflow_gpu_provider.params import gpu_params

    info = get_provider_info()
    assert all(f"{name!r} ({backend.summary})" in info["description"] for name, backend in BACKENDS.items())
    form = gpu_params()["backend"]
    assert form.schema["enum"] == list(RUN_TIME_NAMES)
    for name in BACKENDS:
        assert f"{name!r} (" in form.description or f"{name!r} is chosen when the DAG is parsed" in form.description
    package = Path(__file__).parents[1] / "airflow_gpu_provider"
    triggers = {
        ".".join(("airflow_gpu_provider", *path.relative_to(package).with_suffix("").parts))
        for path in package.rglob("trigger.py")
    }
    listed = {module for entry in info["triggers"] for module in entry["python-modules"]}
    assert listed == triggers, "every trigger module is listed in get_provider_info's triggers"
