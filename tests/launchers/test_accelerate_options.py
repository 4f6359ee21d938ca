"""The accelerate option table: taken from accelerate's own launch_command_parser(), and equivalent to it."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_gpu_provider.launchers import accelerate as launcher


@pytest.fixture(scope="module")
def real_parser():
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()

    def error(message):
        raise ValueError(message)

    parser.error = error  # raise instead of printing usage and exiting
    return parser


@pytest.fixture(scope="module")
def spec():
    return launcher.live_spec()


def test_every_value_type_is_rebuilt(spec):
    """A "custom" converter could not be rebuilt and would only be checked when the task runs."""
    assert {o["type"] for o in spec["options"]} <= {"int", "float", "str", "bool", "str_to_bool", "str_to_bool_list"}


def test_the_shipped_snapshot_matches_the_installed_accelerate(spec):
    """If this fails after an accelerate upgrade: python -m airflow_gpu_provider.launchers.accelerate > SNAPSHOT."""
    assert json.loads(launcher.SNAPSHOT.read_text()) == spec


def test_spec_is_extracted_once_per_host_and_version(tmp_path, spec):
    launcher.load_spec.cache_clear()
    try:
        first = launcher.load_spec(str(tmp_path))
        (cached,) = tmp_path.glob("accelerate-launch-options-*.json")
        assert first == spec
        cached.write_text(json.dumps({**spec, "accelerate_version": "from-cache"}))
        launcher.load_spec.cache_clear()
        assert launcher.load_spec(str(tmp_path))["accelerate_version"] == "from-cache"  # no new extraction
    finally:
        launcher.load_spec.cache_clear()


def test_parsing_a_dag_does_not_import_torch_or_accelerate(tmp_path):
    import subprocess

    code = (
        "import sys; from airflow_gpu_provider.launchers.accelerate import launch_arguments, load_spec;"
        f"load_spec({str(tmp_path)!r}); launch_arguments({{'num_processes': 2}}, owner='t', spec=load_spec({str(tmp_path)!r}));"
        "print(sorted(m for m in ('torch', 'accelerate') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def _values(option):
    if option["kind"] in ("true", "false", "const"):
        return st.sampled_from([True, False, "yes"])
    if option["choices"]:
        return st.one_of(st.sampled_from(option["choices"]), st.just("not-a-choice"))
    if option["type"] == "int":
        return st.one_of(st.integers(0, 64), st.just("two"))
    if option["type"] == "float":
        return st.one_of(st.floats(0, 10, allow_nan=False), st.just("x"))
    if option["kind"] == "append":
        return st.lists(st.sampled_from(["A=1", "B=2"]), min_size=1, max_size=2)
    return st.sampled_from(["value", "1", "true"])


def _option_sets(spec):
    by_dest = {}
    for option in spec["options"]:
        by_dest.setdefault(option["dest"], option)
    names = sorted(by_dest)
    return st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True).flatmap(
        lambda chosen: st.fixed_dictionaries({name: _values(by_dest[name]) for name in chosen})
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_rebuilt_parser_accepts_exactly_what_accelerates_parser_accepts(data, spec, real_parser):
    options = data.draw(_option_sets(spec))
    try:
        argv = launcher.launch_arguments(options, owner="t", spec=spec)
    except ValueError:
        ours = None
    else:
        ours = argv
    if ours is None:
        return  # rejected before parsing (a flag given a value) or by the rebuilt parser: check the latter below
    parsed = vars(real_parser.parse_args([*argv, "script.py"]))
    for name, value in options.items():
        if value is None or value is False:
            continue
        assert parsed[name] is not None, name


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_what_accelerates_parser_rejects_is_rejected_at_parse_time(data, spec, real_parser):
    options = data.draw(_option_sets(spec))
    argv = []
    for name, value in options.items():
        option = next(o for o in spec["options"] if o["dest"] == name)
        if value is False or value is None:
            continue
        if option["kind"] in ("true", "false", "const"):
            argv += [option["flags"][0]] if value is True else [option["flags"][0], str(value)]
        elif isinstance(value, list):
            for item in value:
                argv += [option["flags"][0], item]
        else:
            argv += [option["flags"][0], str(value)]
    try:
        real_parser.parse_args([*argv, "script.py"])
        accepted = True
    except (ValueError, SystemExit):
        accepted = False
    if not accepted:
        with pytest.raises(ValueError):
            launcher.launch_arguments(options, owner="t", spec=spec)
