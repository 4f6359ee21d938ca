"""The runtime envelope of one task try, typed: what the task process runs (``runtime/protocol.py`` has its format).

An :class:`Envelope` is made once per try, from the task's callable and arguments or its command
(:meth:`Envelope.call`, :meth:`Envelope.run`), wrapped by a launcher (:meth:`Envelope.launched`); it becomes the
protocol's JSON in one place only, :meth:`Envelope.to_json`, where the backend adds what it alone knows (the
resource summary, whether the process dies with its worker) and the request adds whether to resume.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from airflow_gpu_provider.runtime import protocol
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.callable import ShippedCallable


@dataclass(frozen=True)
class Envelope:
    """What the runtime runs: a function (its source and JSON arguments) or a command, maybe under a launcher.

    :param launch: the launcher section (``launchers/accelerate.py``): every rank runs the payload
    :param profile: the sampler's settings (``telemetry/report.py``), ``None``: not sampled
    :param clear_cache: clear the CUDA cache before and after the user code
    :param modules: project modules shipped with the payload (``task/modules.py``: names, sha256, zip)
    """

    mode: Literal["callable", "command"]
    function: str | None = None
    source: str | None = None
    filename: str | None = None
    first_line: int = 1
    annotations_future: bool = False
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    command: Sequence[str] = ()
    launch: Mapping[str, Any] | None = None
    profile: Mapping[str, Any] | None = None
    clear_cache: bool = True
    modules: Mapping[str, Any] | None = None

    @classmethod
    def call(cls, shipped: ShippedCallable, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Envelope:
        """Call a shipped function with JSON arguments."""
        return cls(
            "callable",
            function=shipped.name,
            source=shipped.source,
            filename=shipped.filename,
            first_line=shipped.first_line,
            annotations_future=shipped.annotations_future,
            args=list(args),
            kwargs=dict(kwargs),
        )

    @classmethod
    def run(cls, command: Sequence[str]) -> Envelope:
        """Run a command (an argument list; no shell)."""
        return cls("command", command=[str(part) for part in command])

    def launched(self, launch: Mapping[str, Any]) -> Envelope:
        """The same payload, once per rank under a launcher."""
        return dataclasses.replace(self, launch=dict(launch))

    def with_modules(self, modules: Mapping[str, Any] | None) -> Envelope:
        """The same payload, with project modules on its path (``None``: none)."""
        return dataclasses.replace(self, modules=None if modules is None else dict(modules))

    def sampled(self, profile: Mapping[str, Any] | None) -> Envelope:
        """The same payload, sampled by the runtime's profiler with these settings (``None``: not sampled)."""
        return dataclasses.replace(self, profile=None if profile is None else dict(profile))

    def to_json(
        self,
        *,
        summary: Mapping[str, Any],
        resume: bool = False,
        die_with_parent: bool = False,
        modules_from: str | None = None,
    ) -> dict[str, Any]:
        """The envelope as the runtime reads it (protocol version :data:`~.protocol.ENVELOPE_VERSION`).

        :param summary: the resource summary that starts the task's log (``task/environment.py``)
        :param resume: look for the newest checkpoint of the task's folder and resume from it
        :param die_with_parent: the task process is SIGKILLed when its worker dies (the local backend's child)
        :param modules_from: the environment variable that carries the project modules' archive (``env:NAME`` in
            the envelope), ``None``: the archive is in the envelope
        """
        payload: dict[str, Any]
        if self.mode == "callable":
            payload = {
                "function": self.function,
                "source": self.source,
                "filename": self.filename,
                "first_line": self.first_line,
                "annotations_future": self.annotations_future,
                "args": list(self.args),
                "kwargs": dict(self.kwargs),
                "clear_cache": self.clear_cache,
            }
        else:
            payload = {"command": list(self.command)}
        envelope: dict[str, Any] = {"version": protocol.ENVELOPE_VERSION, "mode": self.mode, **payload}
        if self.launch is not None:
            envelope["launch"] = dict(self.launch)
        if self.modules is not None:
            envelope["modules"] = {**self.modules, **({"zip": f"env:{modules_from}"} if modules_from else {})}
        envelope.update(profile=None if self.profile is None else dict(self.profile), summary=dict(summary))
        if resume:
            envelope["resume"] = True
        if die_with_parent:
            envelope["die_with_parent"] = True
        return envelope


def summary(
    resources: ResourceSettings,
    image: ImageSettings,
    *,
    backend: str,
    image_name: str,
    gpus: list[dict[str, Any]] | None,
    cpu_fallback: bool = False,
    fallback_reason: str = "",
) -> dict[str, Any]:
    """The resource summary the runtime prints at the top of every task log.

    :param gpus: the devices the task was given (``Device.describe()``), or ``None`` to let the runtime ask the
        driver (in a container or pod); a task that runs without GPUs always shows none
    :param cpu_fallback: the task runs on the CPU because the GPUs were missing (``on_missing_gpu="cpu"``)
    :param fallback_reason: why, in words (the profile records it as ``cpu_fallback_reason``)

    ``effective`` is what the task really runs with (the runtime exports it as ``AIRFLOW_GPU_RESOURCES``).
    """
    with_gpus = resources.requests_gpus and not cpu_fallback
    effective = resources.without_gpus() if cpu_fallback else resources
    described = {
        "backend": backend,
        "image": image_name,
        "requirements_hash": image.requirements_hash,
        "resources": resources.describe() + (" -> CPU fallback" if cpu_fallback else ""),
        "gpus": gpus if with_gpus else [],
        "effective": {**effective.to_dict(), "cpu_fallback": cpu_fallback},
    }
    if cpu_fallback:
        described["cpu_fallback_reason"] = fallback_reason or "the GPUs asked for were missing or busy"
    return described
