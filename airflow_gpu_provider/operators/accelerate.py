"""``AccelerateOperator``: a function or a script under ``accelerate launch``, on any backend."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_gpu_provider.checkpoint.mixin import CheckpointMixin
from airflow_gpu_provider.dag_line import entry_point
from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError
from airflow_gpu_provider.launchers.accelerate import launch_section, load_spec
from airflow_gpu_provider.operators.execution import GpuExecution
from airflow_gpu_provider.operators.gpu_step import GpuStepOperator
from airflow_gpu_provider.operators.spec import task_owner
from airflow_gpu_provider.settings import ResourceSettings

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_gpu_provider.operators.spec import TaskSpec
    from airflow_gpu_provider.task.envelope import Envelope


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
    :param resume: (:class:`GpuStepOperator`'s) on a retry, load the newest ``accelerator.save_state`` checkpoint
        of the task's checkpoint folder right after the function's first ``accelerator.prepare(...)``, exactly
        (shuffled dataloaders included); a script calls ``airflow_gpu_runtime.resume(accelerator)`` itself (see
        ``docs/resilience.md``)
    """

    template_fields: Sequence[str] = (*GpuStepOperator.template_fields, "script", "script_args")

    @entry_point(task_owner)
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
        owner = task_owner(self, **kwargs)
        spec = load_spec()
        known = {o["dest"] for o in spec["options"]}
        operator_args = _operator_arguments()
        extra = {k: kwargs.pop(k) for k in list(kwargs) if k in known and k not in operator_args}
        unknown = set(kwargs) - operator_args
        if unknown:
            raise UnknownSettingError(owner, unknown, ["AccelerateOperator/BaseOperator arguments", *sorted(known)])
        if isinstance(num_machines, bool) or not isinstance(num_machines, int) or num_machines < 1:
            raise InvalidSettingError(owner, "num_machines", num_machines, "expected a positive integer", "1, 2, ...")
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
        self.num_machines = self.num_nodes = num_machines  # the backend's registry entry says how many it can span
        if num_machines > 1:  # the pods meet on this port (each gets it as MASTER_PORT)
            self.rendezvous_port = main_process_port
        self.script = script
        self.script_args = list(script_args or [])
        # GpuStepOperator takes a callable or a command; a script becomes the launcher's command at run time
        command = None if script is None else [script]
        super().__init__(python_callable=python_callable, command=command, **kwargs)
        self.launch(self.task_spec.resources)  # check the options now, with accelerate's parser

    def launch(self, resources: ResourceSettings) -> dict[str, Any]:
        """The envelope's ``launch`` section for these resources, validated by accelerate's parser."""
        return launch_section(
            resources, self.launch_options, num_machines=self.num_machines, owner=self.task_spec.owner
        )

    def build_envelope(self, context: Context, spec: TaskSpec) -> Envelope:
        """The payload's envelope, wrapped in ``accelerate launch``."""
        if self.script is not None:
            self.command = [self.script, *self.script_args]
        return super().build_envelope(context, spec).launched(self.launch(spec.resources))

    @classmethod
    def _nodes(cls, kwargs: Mapping[str, Any]) -> int:
        return int(kwargs.get("num_machines") or 1)


@functools.cache
def _operator_arguments() -> frozenset[str]:
    """Keyword arguments of AccelerateOperator, GpuStepOperator (its mixins) and BaseOperator."""
    names: set[str] = set()
    for cls in (AccelerateOperator, GpuStepOperator, GpuExecution, CheckpointMixin, BaseOperator):
        names |= set(inspect.signature(cls.__init__).parameters)
    return frozenset(names - {"self", "kwargs", "args"})
