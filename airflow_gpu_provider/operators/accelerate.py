"""``AccelerateOperator``: a function or a script under ``accelerate launch``, on any backend."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError
from airflow_gpu_provider.launchers.accelerate import LAUNCH_MODULE, launch_arguments, load_spec
from airflow_gpu_provider.operators.gpu_step import GpuStepOperator, is_template
from airflow_gpu_provider.settings import ResourceSettings

if TYPE_CHECKING:
    from airflow.sdk import Context

# Set by the runtime from each pod's environment on a multi-node run (Kubernetes Indexed Job).
RANK_FLAGS = {"--machine_rank": "NODE_RANK", "--main_process_ip": "MASTER_ADDR", "--main_process_port": "MASTER_PORT"}
# Options that pick a distributed mode themselves: no --multi_gpu is added next to them.
DISTRIBUTED_MODES = ("use_deepspeed", "use_fsdp", "use_megatron_lm", "tpu")


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
        environment["ACCELERATE_USE_CPU"] = "1"
        if several or num_machines > 1:
            result["multi_gpu"] = True
        else:
            result["cpu"] = True
    elif (several or num_machines > 1) and not distributed:
        result["multi_gpu"] = True
    result.update(options)
    return result, environment


class AccelerateOperator(GpuStepOperator):
    """Run a function (every rank runs it; rank 0's return value goes to XCom) or a script with 🤗 Accelerate.

    Every launch option is checked when the DAG is parsed, by accelerate's own ``launch_command_parser()``
    (see :mod:`airflow_gpu_provider.launchers.accelerate`); an unknown option or a bad value is an error naming it.
    The common options are parameters; any other ``accelerate launch`` option can be passed by name as a keyword
    argument (``num_cpu_threads_per_process=4``) or in ``launch_options``.

    :param script: a training script to launch instead of ``python_callable`` (a path on the worker, or in the
        image for Docker/Kubernetes) (templated)
    :param script_args: its command-line arguments (templated)
    :param num_processes: processes in total; default: the GPUs requested on all machines (1 on CPU)
    :param num_machines: nodes; more than one needs ``backend="kubernetes"`` (an Indexed Job, one pod per node)
    :param multi_gpu: force ``--multi_gpu`` (set automatically for more than one process)
    :param cpu: run on CPU; several processes then use gloo
    :param mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``
    :param main_process_port: rendezvous port; default: a free port (single machine) or 29500 (multi-node)
    :param gpu_ids: GPUs to use, among those the task was given
    :param dynamo_backend: a torch.compile backend, e.g. ``"inductor"``
    :param launch_options: any other ``accelerate launch`` options, by their names
    """

    template_fields: Sequence[str] = (*GpuStepOperator.template_fields, "script", "script_args")

    def __init__(
        self,
        *,
        script: str | None = None,
        script_args: Sequence[str] | None = None,
        python_callable: Callable[..., Any] | None = None,
        num_processes: int | None = None,
        num_machines: int = 1,
        multi_gpu: bool | None = None,
        cpu: bool = False,
        mixed_precision: str | None = None,
        main_process_port: int | None = None,
        gpu_ids: str | Sequence[int] | None = None,
        dynamo_backend: str | None = None,
        launch_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        owner = f"{type(self).__name__}({kwargs.get('task_id', '?')!r})"
        spec = load_spec()
        known = {o["dest"] for o in spec["options"]}
        operator_args = _operator_arguments()
        extra = {k: kwargs.pop(k) for k in list(kwargs) if k in known and k not in operator_args}
        unknown = set(kwargs) - operator_args
        if unknown:
            raise UnknownSettingError(owner, unknown, ["AccelerateOperator/BaseOperator arguments", *sorted(known)])
        if isinstance(num_machines, bool) or not isinstance(num_machines, int) or num_machines < 1:
            raise InvalidSettingError(owner, "num_machines", num_machines, "expected a positive integer", "1, 2, ...")
        if (
            num_machines > 1
            and kwargs.get("backend") not in ("kubernetes", None)
            and not is_template(kwargs.get("backend"))
        ):
            raise InvalidSettingError(
                owner,
                "num_machines",
                num_machines,
                f"backend {kwargs['backend']!r} runs on one machine",
                "num_machines=1, or backend='kubernetes' (one pod per machine)",
            )
        if (script is None) == (python_callable is None):
            raise InvalidSettingError(
                owner,
                "script/python_callable",
                None,
                "give exactly one of them",
                "script='train.py' or python_callable=f",
            )
        self.launch_options: dict[str, Any] = {
            "num_processes": num_processes,
            "multi_gpu": multi_gpu,
            "cpu": cpu,
            "mixed_precision": mixed_precision,
            "main_process_port": main_process_port,
            "gpu_ids": gpu_ids,
            "dynamo_backend": dynamo_backend,
            **dict(launch_options or {}),
            **extra,
        }
        for reserved in ("num_machines", "machine_rank", "main_process_ip"):
            if self.launch_options.get(reserved) is not None:
                raise InvalidSettingError(
                    owner,
                    reserved,
                    self.launch_options[reserved],
                    "the provider sets it from num_machines and the pods' ranks",
                    "num_machines=N",
                )
        self.num_machines = self.num_nodes = num_machines
        self.script = script
        self.script_args = list(script_args or [])
        # GpuStepOperator takes a callable or a command; a script becomes the launcher's command at run time
        command = None if script is None else [script]
        super().__init__(python_callable=python_callable, command=command, **kwargs)
        self.launch_arguments(self.resource_settings)  # check the options now, with accelerate's parser

    def launch_arguments(self, resources: ResourceSettings) -> tuple[list[str], dict[str, str]]:
        """Validated ``accelerate launch`` arguments and environment for these resources.

        On several machines the port is left out: each pod passes the headless Service's (``MASTER_PORT``).
        """
        options = self.launch_options
        if self.num_machines > 1:
            options = {**options, "main_process_port": None}
        options, environment = accelerate_options(resources, options, num_machines=self.num_machines)
        return launch_arguments(options, owner=f"{type(self).__name__}({self.task_id!r})"), environment

    def build_envelope(self, context: Context, resources: ResourceSettings) -> dict[str, Any]:
        """The payload's envelope, wrapped in ``accelerate launch``."""
        if self.script is not None:
            self.command = [self.script, *self.script_args]
        envelope = super().build_envelope(context, resources)
        args, environment = self.launch_arguments(resources)
        multi_node = self.num_machines > 1
        port = self.launch_options.get("main_process_port")
        envelope["launch"] = {
            "module": LAUNCH_MODULE,
            "args": args,
            "environment": environment,
            "from_environment": RANK_FLAGS if multi_node else {},
            "free_port_flag": None if multi_node or port else "--main_process_port",
            "port": port,
        }
        return envelope


@functools.cache
def _operator_arguments() -> frozenset[str]:
    """Keyword arguments of AccelerateOperator, GpuStepOperator and BaseOperator."""
    names: set[str] = set()
    for cls in (AccelerateOperator, GpuStepOperator, BaseOperator):
        names |= set(inspect.signature(cls.__init__).parameters)
    return frozenset(names - {"self", "kwargs", "args"})
