"""GPU counts, and a share of one GPU: ``gpu_count=0.25`` or ``gpu_share="8GiB"``, one typed value for backends.

A share is :class:`GpuShare`: a fraction of one GPU or an amount of its memory. A backend translates it (the host
allocator places it among a host's GPUs by memory, ``host/shares.py``; Ray takes the fraction as ``num_gpus``; a
Slurm backend may map it to ``gres/shard`` or ``gres/mps``), or refuses it (``BackendInfo.check``). A host
promises a GPU in :data:`SHARE_PARTS` parts: a fraction of 4 decimals is a whole number of them, a memory share
rounds up (the promise is never smaller than the share).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.runtime.protocol import format_bytes
from airflow_gpu_provider.settings.grammar import DECIMAL, FRACTION
from airflow_gpu_provider.settings.units import MAX_BYTES, parse_bytes

ALL_GPUS: Literal["all"] = "all"
GpuCount = int | float | Literal["all"]  # a float is a share of one GPU (0 < x < 1), on the backends that share
MAX_GPUS = 1024  # per machine; more is a typo (or a count in the wrong field)
SHARE_PARTS = 10_000  # a GPU is promised in ten-thousandths: gpu_count=0.3333 is 3333 of them
MIN_SHARE = 64 * 2**20  # less is no GPU workload (and MPS limits are given in MiB)
SHARE_ACCEPTED = "a memory size of one GPU such as '8GiB', '512Mi' or integer bytes (or gpu_count=0.25 for a fraction)"
_OWNER = "ResourceSettings"


def parse_count(name: str, value: object, *, allow_all: bool) -> GpuCount:
    """A GPU count: an integer, ``"all"``, or a share of one GPU (``0 < x < 1``, at most 4 decimals)."""
    accepted = f"an integer from 0 to {MAX_GPUS}, or a share of one GPU (0.5)" + (" or 'all'" if allow_all else "")
    if allow_all and value == ALL_GPUS:
        return ALL_GPUS
    if isinstance(value, bool):
        raise InvalidSettingError(_OWNER, name, value, "booleans are not counts", accepted)
    if isinstance(value, str) and DECIMAL.fullmatch(value.strip()):
        value = int(value.strip())  # rendered templates arrive as text
    if isinstance(value, str) and FRACTION.fullmatch(value.strip()):
        value = float(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, float) and 0 < value < 1 and round(value, 4) == value:
        return value  # a share of one GPU: BackendInfo.check refuses it where the backend cannot share one
    if not isinstance(value, int):
        raise InvalidSettingError(_OWNER, name, value, "it should be an integer", accepted)
    if value < 0:
        raise InvalidSettingError(_OWNER, name, value, "it must not be negative", accepted)
    if value > MAX_GPUS:
        raise InvalidSettingError(_OWNER, name, value, f"more than {MAX_GPUS} GPUs on one machine", accepted)
    return value


def parse_share(value: object, gpu_count: GpuCount, mig_profile: object) -> int:
    """``gpu_share`` in bytes, with the ``gpu_count`` it implies checked (0 or 1: one GPU); no MIG slice."""
    try:
        amount = parse_bytes(value)  # type: ignore[arg-type]  # a wrong type is a TypeError, named below
    except (TypeError, ValueError) as err:
        raise InvalidSettingError(_OWNER, "gpu_share", value, str(err), SHARE_ACCEPTED) from None
    if not MIN_SHARE <= amount <= MAX_BYTES:
        why = f"out of range ({format_bytes(MIN_SHARE)} to {format_bytes(MAX_BYTES)})"
        raise InvalidSettingError(_OWNER, "gpu_share", value, why, SHARE_ACCEPTED)
    if isinstance(gpu_count, float):
        why = f"gpu_count={gpu_count!r} is a share already: give the share in one place"
        raise InvalidSettingError(_OWNER, "gpu_share", value, why, "gpu_share='8GiB' or gpu_count=0.25, not both")
    if gpu_count not in (0, 1):
        why = f"a share is of one GPU, and gpu_count={gpu_count!r}"
        raise InvalidSettingError(_OWNER, "gpu_share", value, why, "gpu_count=1 (or none) with gpu_share")
    if mig_profile is not None:
        why = "a share of a MIG slice is not supported"
        raise InvalidSettingError(_OWNER, "gpu_share", value, why, "a MIG slice (mig_profile) or a share, not both")
    return amount


@dataclass(frozen=True)
class GpuShare:
    """A share of one GPU: ``fraction`` of it (``gpu_count=0.25``) or ``memory`` bytes of it (``gpu_share``)."""

    fraction: float | None = None
    memory: int | None = None

    def memory_on(self, total: int | None) -> int | None:
        """The bytes this share holds of a GPU of ``total`` bytes (``None``: a fraction of a GPU of unknown size)."""
        if self.memory is not None:
            return self.memory
        return None if total is None or self.fraction is None else int(total * self.fraction)

    def parts_on(self, total: int | None) -> int | None:
        """The :data:`SHARE_PARTS` of a GPU of ``total`` bytes this share takes, rounded up.

        ``None`` where a memory share cannot be placed: the GPU's size is unknown, or smaller than the share.
        """
        if self.fraction is not None:
            return round(self.fraction * SHARE_PARTS)
        if not total or self.memory is None or self.memory > total:
            return None
        return -(-self.memory * SHARE_PARTS // total)

    def describe(self) -> str:
        """``8.0 GiB`` or ``0.25`` (of one GPU)."""
        return format_bytes(self.memory) if self.memory is not None else f"{self.fraction:g}"
