"""``AccelerateOperator``: a function or a script under ``accelerate launch``, on any backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.dag_line import entry_point
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.launchers.accelerate import launch_section, load_spec
from airflow_gpu_provider.operators.arguments import accepted
from airflow_gpu_provider.operators.gpu_step import GpuStepOperator
from airflow_gpu_provider.operators.spec import TaskSpec, task_owner

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.definitions.mappedoperator import OperatorPartial

    from airflow_gpu_provider.settings import ResourceSettings
    from airflow_gpu_provider.task.callable import ShippedCallable
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
        num_machines: int | None = None,
        multi_gpu: bool | None = None,
        cpu: bool | None = None,
        mixed_precision: str | None = None,
        main_process_port: int | None = None,
        gpu_ids: str | Sequence[int] | None = None,
        dynamo_backend: str | None = None,
        launch_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        own = {name: value for name, value in locals().items() if name in LAUNCH_ARGUMENTS and value is not None}
        extra, kwargs = split_launch(type(self), kwargs)
        owner = task_owner(self, **kwargs)
        self.script, self.script_args = script, list(script_args or [])
        launch = {**own, **dict(launch_options or {}), **extra}
        arguments = {**kwargs, "python_callable": python_callable, "script": script, "launch_options": launch}
        kwargs["task_spec"] = type(self).settle(owner, arguments, kwargs.get("task_spec"))
        # GpuStepOperator takes a callable or a command; a script becomes the launcher's command at run time
        super().__init__(python_callable=python_callable, command=None if script is None else [script], **kwargs)

    @classmethod
    def _settled(cls, owner: str, arguments: Mapping[str, Any], settled: TaskSpec | None) -> TaskSpec:
        """The task's settings, and the ``accelerate launch`` options checked by accelerate's own parser."""
        launch = {name: arguments[name] for name in LAUNCH_ARGUMENTS if arguments.get(name) is not None}
        launch.update(arguments.get("launch_options") or {})
        if settled is not None and (not launch or launch == settled.launch):
            return super()._settled(owner, arguments, settled)
        launch = {**((settled.launch or {}) if settled is not None else {}), **launch}
        for reserved in ("machine_rank", "main_process_ip"):
            if launch.get(reserved) is not None:
                raise InvalidSettingError(
                    owner, reserved, launch[reserved], "the provider sets it from num_machines and the pods' ranks",
                    "num_machines=N",
                )  # fmt: skip
        nodes = launch.get("num_machines", 1)
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise InvalidSettingError(owner, "num_machines", nodes, "expected a positive integer", "1, 2, ...")
        if settled is None:
            spec = TaskSpec.settle(owner, arguments, num_nodes=nodes)
        else:
            spec = settled.changed(arguments, num_nodes=nodes)
        share = spec.resources.share
        if share is not None:
            field = "gpu_share" if spec.resources.gpu_share is not None else "gpu_count"
            raise InvalidSettingError(
                spec.owner, field, getattr(spec.resources, field),
                "a multi-process launch (accelerate launch) takes whole GPUs: each rank would take the share again",
                "gpu_count=1 or more whole GPUs; a share runs a function or a command in one process",
            )  # fmt: skip
        launch_section(spec.resources, _without_machines(launch), num_machines=nodes, owner=spec.owner)  # a check
        return spec._replace(launch=launch)

    @classmethod
    def _payload(cls, owner: str, arguments: Mapping[str, Any], *, complete: bool) -> ShippedCallable | None:
        """A script or a function, exactly one (a script is the launcher's command); its call checked."""
        script, function = arguments.get("script"), arguments.get("python_callable")
        if script is not None or arguments.get("command") is None:  # the payload in this operator's own names
            if (script is not None and function is not None) or (complete and script is None and function is None):
                raise InvalidSettingError(
                    owner, "script/python_callable", script if function is None else function,
                    "give exactly one of them", "script='x.py' or python_callable=f",
                )  # fmt: skip
            arguments = {**arguments, "command": None if script is None else [script]}
        return super()._payload(owner, arguments, complete=complete)

    @classmethod
    @entry_point(task_owner)
    def partial(cls, *, task_id: str, **kwargs: Any) -> OperatorPartial:  # type: ignore[override]
        """``.partial(...)``: launch options given by name travel in ``launch_options`` (what Airflow maps)."""
        extra, kwargs = split_launch(cls, kwargs)
        if extra:
            kwargs["launch_options"] = {**dict(kwargs.get("launch_options") or {}), **extra}
        return super().partial(task_id=task_id, **kwargs)

    @property
    def num_machines(self) -> int:
        """The machines one try spans (``num_machines``)."""
        return self.task_spec.num_nodes

    @property
    def rendezvous_port(self) -> int | None:  # type: ignore[override]
        """Where a multi-node launch meets: ``main_process_port``, else the backend's default."""
        return (self.task_spec.launch or {}).get("main_process_port") if self.num_machines > 1 else None

    @property
    def launch_options(self) -> dict[str, Any]:
        """The ``accelerate launch`` options, as given (and checked)."""
        return _without_machines(self.task_spec.launch or {})

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


#: AccelerateOperator's own launch arguments (the others: ``launch_options``, or by name).
LAUNCH_ARGUMENTS = (
    "num_processes", "num_machines", "multi_gpu", "cpu", "mixed_precision", "main_process_port", "gpu_ids",
    "dynamo_backend",
)  # fmt: skip


def split_launch(operator_class: type, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(the accelerate launch options given by name, the other arguments)``.

    A name the operator declares is its own argument; another that accelerate's parser knows
    (``num_cpu_threads_per_process``) is a launch option.
    """
    names = {o["dest"] for o in load_spec()["options"]} - accepted(operator_class)
    launch = {name: value for name, value in kwargs.items() if name in names}
    return launch, {name: value for name, value in kwargs.items() if name not in launch}


def _without_machines(launch: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in launch.items() if name != "num_machines"}
