"""Errors raised by the provider.

Settings errors are ``ValueError``/``TypeError`` subclasses raised while the DAG is parsed; they name the field,
the value and what is accepted. Run-time errors are ``RuntimeError`` subclasses raised on the worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class InvalidSettingError(ValueError):
    """A setting has a bad value. Raised at DAG parse time, before anything starts.

    Leaving an entry point of a DAG file, its message starts with the DAG's ``file:line`` (``dag_line``) and the
    task (:mod:`airflow_gpu_provider.dag_line`).
    """

    dag_line: tuple[str, int] | None = None  # the DAG file and line that caused it, once known
    #: where the mistake lies when the raiser knows better than its caller's line (a name read inside a function)
    source_line: tuple[str, int] | None = None

    def __init__(self, owner: str, field: str, value: object, reason: str, accepted: str | None = None) -> None:
        """``value`` ``...``: the field is shown alone (a call, whose values the message cannot show)."""
        from airflow_gpu_provider.runtime.protocol import redact  # rule S1: no credential in an import error

        self.owner, self.field, self.value, self.reason, self.accepted = owner, field, value, reason, accepted
        message = f"{owner}: {field}{'' if value is ... else f'={value!r}'} is invalid: {reason}"
        if accepted:
            message += f". Accepted: {accepted}"
        super().__init__(redact(message))


class UnknownSettingError(InvalidSettingError, TypeError):
    """An option name that the receiver does not know (Metaflow-style: list what is supported, the closest first).

    :param hint: what to say before the list; default: the closest supported names (``Did you mean 'memory'?``)
    :param listed: the supported names in words, where listing every one would bury them (an operator's)
    """

    def __init__(
        self,
        owner: str,
        names: Iterable[str],
        supported: Iterable[str],
        hint: str = "",
        *,
        what: str = "option",
        listed: str | None = None,
    ) -> None:
        names, supported = sorted(names), sorted(supported)
        supported_text = listed or ", ".join(supported)
        self.owner, self.field, self.value = owner, names[0], None
        self.reason, self.accepted = f"unknown {what}", supported_text
        hint = hint or closest(names, supported)
        ValueError.__init__(
            self,
            f"{owner} does not support the {what}(s) {', '.join(map(repr, names))}. "
            + (f"{hint} " if hint else "")
            + f"These {what}s are supported: {supported_text}",
        )


#: Names other tools give the same settings (Ray's ``num_gpus``, Metaflow's ``gpu``, Kubernetes' ``env``): a name
#: spelt so is answered with the provider's own, where the receiver takes it.
OTHER_TOOLS_NAMES: dict[str, str] = {
    **dict.fromkeys(("gpus", "gpu", "num_gpus", "n_gpus", "ngpus", "gpu_num", "nproc_gpus"), "gpu_count"),
    **dict.fromkeys(("cpus", "cpu", "num_cpus", "n_cpus", "ncpus", "vcpus"), "cpu_count"),
    **dict.fromkeys(("mem", "ram", "memory_limit", "mem_limit", "memory_gb"), "memory"),
    **dict.fromkeys(("gpu_type", "gpu_model", "accelerator_type", "gpu_name"), "accelerator"),
    **dict.fromkeys(("shm", "shared_memory", "shm_size_gb"), "shm_size"),
    **dict.fromkeys(("env", "env_vars", "environment_variables"), "environment"),
    **dict.fromkeys(("base_image", "docker_image", "container_image"), "parent_image"),
    **dict.fromkeys(("pip_packages", "packages", "pip", "pip_requirements"), "requirements"),
    **dict.fromkeys(("checkpoint_dir", "checkpoint_path", "ckpt_dir"), "checkpoint"),
}


def closest(names: Iterable[str], supported: Iterable[str]) -> str:
    """``Did you mean 'memory' for 'gpu_memory'?`` for each name with a close supported one; else ``""``.

    A name another tool gives a setting (:data:`OTHER_TOOLS_NAMES`: ``gpus``) is answered with the provider's.
    """
    import difflib

    choices = list(supported)
    hints = {
        name: [OTHER_TOOLS_NAMES[name]]
        if OTHER_TOOLS_NAMES.get(name) in choices
        else difflib.get_close_matches(name, choices, n=3)
        for name in names
    }
    return " ".join(f"Did you mean {' or '.join(map(repr, h))} for {n!r}?" for n, h in hints.items() if h)


class GpuTaskError(RuntimeError):
    """A GPU task could not run or failed on the worker.

    ``failure``: the ``gpu_failure`` record when the infrastructure, not the task, is why (``class``, ``reason``,
    ``evidence``, ``host``/``node``, ``gpus``; :class:`GpuInfrastructureError`, or a pod no node took in time).
    """

    failure: dict[str, Any] | None = None


class GpuUnavailableError(GpuTaskError):
    """Fewer GPUs are present or free than the task requested (``on_missing_gpu="fail"``)."""


class MissingDependencyError(GpuTaskError, ImportError):
    """An optional dependency is missing; the message names the extra and the packages it brings."""

    def __init__(self, what: str, extra: str) -> None:
        packages = " ".join(f"'{requirement}'" for requirement in extra_requirements(extra))
        how = f"pip install {packages}" if packages else f"pip install 'airflow-gpu-provider[{extra}]'"
        super().__init__(f"{what} is not installed. Install the provider's {extra!r} extra: {how}")


def extra_requirements(extra: str) -> list[str]:
    """What the installed provider's ``extra`` brings, from its metadata (installable while no release is published)."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    try:
        declared = [Requirement(line) for line in requires("airflow-gpu-provider") or []]
    except PackageNotFoundError:
        return []
    return [
        str(Requirement(f"{r.name}{r.specifier}"))
        for r in declared
        if r.marker is not None and r.marker.evaluate({"extra": extra})
    ]


class RemoteTaskError(GpuTaskError):
    """The user code raised inside the child process, container or pod.

    :param error_type: the exception's class name in the remote process
    :param remote_traceback: the formatted traceback from the remote process
    :param profile: the try's profile (``telemetry``), if it was sampled
    :param gpus: the GPUs the try ran on (``Device.describe()`` / NVML's view), when the runtime said
    """

    kind = "error"  # the runtime's error kind; OOM escalation climbs on the two below

    def __init__(
        self,
        message: str,
        *,
        error_type: str = "",
        remote_traceback: str = "",
        profile: Mapping[str, Any] | None = None,
        gpus: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.error_type = error_type
        self.remote_traceback = remote_traceback
        self.profile = profile
        self.gpus = list(gpus or [])
        super().__init__(message)


class GpuOutOfMemoryError(RemoteTaskError):
    """The user code ran out of GPU memory (a CUDA OOM, in any rank of a launch): a distinct kind of failure."""

    kind = "gpu_oom"


class HostOutOfMemoryError(RemoteTaskError):
    """The task ran out of host memory: its container or pod was OOM-killed, or Python raised ``MemoryError``."""

    kind = "host_oom"


class GpuInfrastructureError(RemoteTaskError):
    """The try failed because of the infrastructure, not the task's code.

    A GPU fault (an Xid error, an uncorrectable ECC error), an NCCL timeout or abort, a pod evicted, preempted or
    lost with its node, an image that cannot be pulled.

    :param failure: the ``gpu_failure`` record: ``class``, ``reason``, ``evidence``, ``host``/``node``, ``gpus``
    """

    kind = "infrastructure"

    def __init__(self, message: str, *, failure: Mapping[str, Any], **details: Any) -> None:
        self.failure = dict(failure)
        super().__init__(message, **details)


#: What to do after an out-of-memory failure, by its kind: worded once, for every backend and the OOM ladder.
OOM_REMEDY: dict[str, str] = {
    GpuOutOfMemoryError.kind: (
        "Give it a GPU with more memory (on_oom=OomEscalation(accelerators=[...]) makes the next try ask for one) "
        "or make it use less (a smaller batch)."
    ),
    HostOutOfMemoryError.kind: (
        "Give it more memory (ResourceSettings.memory, or on_oom=OomEscalation(memory=[...]) for the next try) or "
        "make it use less."
    ),
}
