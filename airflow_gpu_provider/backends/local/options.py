"""``backend_options`` of the local backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from airflow_gpu_provider.backends.options import BackendOptions, BadOption, option, seconds, text
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.host.inventory import parse_devices


def _devices(value: object) -> str:
    try:
        parse_devices(text(value))
    except InvalidSettingError as err:
        raise BadOption(err.reason, err.accepted) from None
    return str(value)


@dataclass(frozen=True)
class LocalOptions(BackendOptions):
    """The local backend's options.

    :param devices: this host's GPUs, instead of ``[gpu] devices``
    :param state_dir: the host-wide GPU locks and venv cache, instead of ``[gpu] state_dir``
    :param kill_grace: seconds between SIGTERM and SIGKILL when the task is stopped (default ``[gpu] kill_grace``)
    """

    backend: ClassVar[str] = "local"

    devices: str | None = option(check=_devices)
    state_dir: str | None = option(check=text)
    kill_grace: float | None = option(check=seconds)
