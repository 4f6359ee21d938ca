"""🤗 Accelerate launch options: validated by accelerate's own ``launch_command_parser()``, turned into argv.

Importing accelerate's parser imports torch (seconds), and the DAG processor may not even have accelerate
installed. So the parser's option table (names, flags, types, choices) is extracted from
``launch_command_parser()`` once per host and accelerate version, in a child process, and cached as JSON under
``[gpu] state_dir``; a DAG parse rebuilds an equivalent argparse parser from it in microseconds. Without
accelerate on the parsing host, the snapshot shipped with the provider (``accelerate_launch_options.json``,
checked against the installed accelerate by the tests) is used. At run time ``accelerate launch`` in the task's
image parses the same arguments again; that version is what counts.

``python -m airflow_gpu_provider.launchers.accelerate`` prints the live option table.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError
from airflow_gpu_provider.host.state import UntrustedStateError, open_private, private_dir
from airflow_gpu_provider.runtime import protocol
from airflow_gpu_provider.settings import ResourceSettings

SNAPSHOT = Path(__file__).with_name("accelerate_launch_options.json")
LAUNCH_MODULE = "accelerate.commands.launch"
SPEC_FORMAT = 2  # part of the cache file name: a provider that extracts differently does not read old tables
_TYPES = {"int": int, "float": float, "str": str, "bool": bool}
# Set by the runtime from each pod's environment on a multi-node run (Kubernetes Indexed Job).
RANK_ARGUMENTS = {
    "--machine_rank": "NODE_RANK",
    "--main_process_ip": "MASTER_ADDR",
    "--main_process_port": "MASTER_PORT",
}
# Without a GPU, the same processes run on the CPU, on gloo (accelerate's --cpu would start only one).
CPU_ENVIRONMENT = {"ACCELERATE_USE_CPU": "1"}
# Options that pick a distributed mode themselves: no --multi_gpu is added next to them.
DISTRIBUTED_MODES = ("use_deepspeed", "use_fsdp", "use_megatron_lm", "tpu")
# Without a config file accelerate warns, on every launch, about each of these it fills in: they are given.
STATED_DEFAULTS = {"mixed_precision": "no", "dynamo_backend": "no"}
# Several ranks on a machine: torch elastic reads each one's output line by line and writes it whole, its rank first.
RANK_LINES = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": protocol.RANK_PREFIX.format(rank="${rank}")}


def _str_to_bool(value: str) -> bool:
    """Accelerate's ``str_to_bool``."""
    lowered = value.lower()
    if lowered in ("y", "yes", "t", "true", "on", "1"):
        return True
    if lowered in ("n", "no", "f", "false", "off", "0"):
        return False
    raise ValueError(f"invalid truth value {value!r}")


def _str_to_bool_list(value: str) -> tuple[bool, ...]:
    """Accelerate's ``lambda x: tuple(map(str_to_bool, x.split(",")))``."""
    return tuple(map(_str_to_bool, value.split(",")))


def _type_name(converter: Any) -> str:
    """The name of an option's value type; ``custom`` for a converter that cannot be rebuilt (checked at run time)."""
    name = getattr(converter, "__name__", "str")
    if name in (*_TYPES, "str_to_bool"):
        return name
    if name == "<lambda>":
        import inspect

        source = inspect.getsource(converter)
        if "str_to_bool" in source and 'split(",")' in source:
            return "str_to_bool_list"
    return "custom" if converter is not None else "str"


def extract_spec(parser: argparse.ArgumentParser, version: str) -> dict[str, Any]:
    """The option table of an argparse parser, as JSON-friendly data."""
    options = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        # by class name: accelerate has its own _StoreTrueAction etc., not argparse's subclasses
        kind = {
            "_StoreTrueAction": "true",
            "_StoreFalseAction": "false",
            "_StoreConstAction": "const",
            "_AppendAction": "append",
        }.get(type(action).__name__, "value")
        options.append(
            {
                "dest": action.dest,
                "flags": list(action.option_strings),
                "kind": kind,
                "type": _type_name(action.type),
                "choices": list(action.choices) if action.choices else None,
                "const": action.const if kind == "const" else None,
            }
        )
    return {"accelerate_version": version, "options": options}


def live_spec() -> dict[str, Any]:
    """Extract the option table from the installed accelerate (imports torch)."""
    from accelerate.commands.launch import launch_command_parser

    return extract_spec(launch_command_parser(), importlib.metadata.version("accelerate"))


@functools.lru_cache(maxsize=4)
def load_spec(state_dir: str | None = None) -> dict[str, Any]:
    """The option table for validation: the installed accelerate's (cached per version), else the snapshot."""
    if importlib.util.find_spec("accelerate") is None:
        return json.loads(SNAPSHOT.read_text())
    version = importlib.metadata.version("accelerate")
    if state_dir is None:
        from airflow_gpu_provider import config

        state_dir = config.get("state_dir")
    cache = Path(state_dir, f"accelerate-launch-options-{version}-v{SPEC_FORMAT}.json")
    trusted = True
    try:
        private_dir(state_dir)
        with os.fdopen(open_private(cache, os.O_RDONLY)) as cached:
            return dict(json.load(cached))
    except FileNotFoundError:
        pass
    except UntrustedStateError:
        trusted = False  # read the table afresh, and cache nothing in a folder another user controls
    import subprocess
    import tempfile

    out = subprocess.run(
        [sys.executable, "-m", __name__], capture_output=True, text=True, check=True, timeout=300
    ).stdout
    spec = json.loads(out)
    if trusted:
        with tempfile.NamedTemporaryFile("w", dir=cache.parent, delete=False, suffix=".tmp") as handle:
            handle.write(out)
        os.replace(handle.name, cache)
    return spec


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # raise instead of printing usage and exiting
        raise ValueError(message)


def build_parser(spec: Mapping[str, Any]) -> argparse.ArgumentParser:
    """An argparse parser equivalent to accelerate's for validation (same flags, types and choices)."""
    parser = _Parser(prog="accelerate launch", add_help=False, allow_abbrev=False)
    for option in spec["options"]:
        kwargs: dict[str, Any] = {"dest": option["dest"]}
        if option["kind"] in ("true", "false"):
            kwargs["action"] = f"store_{option['kind']}"
        elif option["kind"] == "const":
            kwargs.update(action="store_const", const=option["const"])
        else:
            kwargs["action"] = "append" if option["kind"] == "append" else "store"
            kwargs["type"] = {"str_to_bool": _str_to_bool, "str_to_bool_list": _str_to_bool_list}.get(
                option["type"], _TYPES.get(option["type"], str)
            )
            if option["choices"]:
                kwargs["choices"] = option["choices"]
        parser.add_argument(*option["flags"], **kwargs)
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def launch_arguments(options: Mapping[str, Any], *, owner: str, spec: Mapping[str, Any] | None = None) -> list[str]:
    """Turn ``{"num_processes": 2, "multi_gpu": True, ...}`` into validated ``accelerate launch`` arguments.

    Values: ``True`` for a flag, ``False``/``None`` to leave it out, a list for repeatable options, anything
    else is passed as text.

    :raises UnknownSettingError: for an option accelerate does not have (with the closest names)
    :raises InvalidSettingError: for a value accelerate's parser rejects (wrong type, not among the choices)
    """
    spec = spec or load_spec()
    by_dest = {o["dest"]: o for o in spec["options"]}
    unknown = [name for name in options if name not in by_dest]
    if unknown:
        raise UnknownSettingError(f"{owner}: accelerate {spec['accelerate_version']} launch", unknown, by_dest)
    argv: list[str] = []
    for name, value in options.items():
        option = by_dest[name]
        flag = option["flags"][0]
        if value is None or value is False:
            continue
        if option["kind"] in ("true", "false", "const"):
            if value is not True:
                raise InvalidSettingError(owner, name, value, "it is a flag", "True, or False/None to leave it out")
            argv.append(flag)
        elif option["kind"] == "append" and isinstance(value, (list, tuple)):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)]
    try:
        build_parser(spec).parse_args([*argv, "script.py"])
    except ValueError as err:
        name = next((n for n in options if any(f in str(err) for f in by_dest[n]["flags"])), "launch options")
        choices = by_dest[name]["choices"] if name in by_dest else None
        raise InvalidSettingError(
            owner,
            name,
            options.get(name),
            f"accelerate launch rejects it: {err}",
            " or ".join(map(repr, choices)) if choices else None,
        ) from None
    return argv


def accelerate_options(
    resources: ResourceSettings, options: Mapping[str, Any], *, num_machines: int
) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``accelerate launch`` options and environment for a run with these resources.

    ``num_processes`` defaults to the GPUs of all machines (``gpu_count`` per machine). ``cpu=True`` (or no GPU)
    with several processes becomes ``--multi_gpu`` plus ``ACCELERATE_USE_CPU=1``: accelerate's ``--cpu`` would
    start only one process, while this starts them all, on gloo.
    """
    options = {k: v for k, v in options.items() if v is not None}
    cpu = bool(options.pop("cpu", False)) or not resources.requests_gpus
    gpus = resources.gpu_count if isinstance(resources.gpu_count, int) else 0
    processes = options.pop("num_processes", None) or (1 if cpu or not gpus else gpus * num_machines)
    environment: dict[str, str] = {}
    result: dict[str, Any] = {"num_processes": processes}  # a bad value is left to accelerate's parser to name
    several = str(processes).isdigit() and int(processes) > 1
    if num_machines > 1:
        result["num_machines"] = num_machines
    distributed = any(options.get(mode) for mode in DISTRIBUTED_MODES)
    if cpu:
        environment.update(CPU_ENVIRONMENT)
        if several or num_machines > 1:
            result["multi_gpu"] = True
        else:
            result["cpu"] = True
    elif (several or num_machines > 1) and not distributed:
        result["multi_gpu"] = True
    result.update(options)
    return result, environment


def launch_section(
    resources: ResourceSettings, options: Mapping[str, Any], *, num_machines: int, owner: str
) -> dict[str, Any]:
    """The envelope's ``launch`` section (the runtime's protocol) for ``accelerate launch`` with these options.

    On several machines the port is left out of the arguments: each pod passes the headless Service's
    (``MASTER_PORT``), and the pod's rank variables fill ``rank_arguments``. Without a ``config_file``, the
    defaults accelerate would warn about are given (:data:`STATED_DEFAULTS`, ``num_machines``): a worker's own
    ``accelerate config`` file does not change a task.
    """
    multi_node = num_machines > 1
    chosen_port = options.get("main_process_port")
    if multi_node:
        options = {**options, "main_process_port": None}
    options, environment = accelerate_options(resources, options, num_machines=num_machines)
    if options.get("config_file") is None:  # the defaults a task's own config file would give are its to give
        options = {"num_machines": num_machines, **STATED_DEFAULTS, **options}
    args = launch_arguments(options, owner=owner)  # checks num_processes: an int from here on
    per_machine = max(1, int(options["num_processes"]) // num_machines)
    tee = per_machine > 1 and options.get("tee") is None  # the task's own choice otherwise
    return {
        "module": LAUNCH_MODULE,
        "args": [*args, "--tee", "3"] if tee else args,
        "processes": per_machine,  # ranks per machine: their threads
        "environment": {**environment, **(RANK_LINES if per_machine > 1 else {})},
        "cpu_environment": dict(CPU_ENVIRONMENT),
        "rank_arguments": dict(RANK_ARGUMENTS) if multi_node else {},
        "free_port_argument": None if multi_node or chosen_port else "--main_process_port",
        "log_dir_argument": "--log_dir" if tee and options.get("log_dir") is None else None,
    }


if __name__ == "__main__":
    print(json.dumps(live_spec(), indent=1))
