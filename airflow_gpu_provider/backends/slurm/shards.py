"""A share of one GPU on Slurm: a number of its GPU's ``gres/shard`` (Slurm 22.05), and how the share is enforced.

The connection's accelerators map says how many shards one GPU of a model has (``{"gres": "a100", "shards": 4}``);
a share is the fewest shards that hold it (``gpu_count=0.3`` of 4 shards: 2; ``gpu_share="20GiB"`` of an A100's
40 GiB in 4: 2). Slurm places them: shards of one GPU, on a GPU no whole-GPU job holds (and the reverse); the job
sees that GPU (``CUDA_VISIBLE_DEVICES``) and ``SLURM_SHARDS_ON_NODE``. Shards enforce no memory, so the share is
enforced as on a host without MPS (``host/mps.py`` :func:`~airflow_gpu_provider.host.mps.without_mps`): PyTorch's
cap in the runtime for a function, a command refused unless the admin allows unenforced shares. A right-sized try
(``right_size=True``) asks for the shards of the last successful run's peak x 1.2 (:func:`taken`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from airflow_gpu_provider.backends.slurm.connection import Cluster
from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.host.mps import Enforcement, without_mps
from airflow_gpu_provider.settings.accelerators import card_memory_gib
from airflow_gpu_provider.settings.shares import GpuShare
from airflow_gpu_provider.settings.units import format_bytes

WHY = "Slurm's gres/shard enforces no memory"


@dataclass(frozen=True)
class Shards:
    """The shards one share takes.

    :param count: shards the job asks for
    :param per_gpu: shards of one GPU
    :param types: the GRES types (node features) they may come from
    """

    count: int
    per_gpu: int
    types: tuple[str, ...]

    @property
    def gres(self) -> dict[str, str]:
        """``--gres`` (and ``--constraint`` for several types)."""
        if len(self.types) == 1:
            return {"gres": f"shard:{self.types[0]}:{self.count}"}
        return {"gres": f"shard:{self.count}", "constraint": "|".join(self.types)}


def _count(share: GpuShare, model: str, per_gpu: int) -> int | str:
    """Shards of a GPU of ``model`` that hold ``share``, or why none do."""
    if share.fraction is not None:
        return max(1, math.ceil(round(share.fraction * per_gpu, 6)))
    gib = card_memory_gib(model)
    if gib is None or share.memory is None:
        return f"the memory of {model} is not known (name the model as the provider knows it)"
    if share.memory > gib * 2**30:
        return f"{model} has {gib:g} GiB"
    return max(1, math.ceil(round(share.memory / (gib * 2**30) * per_gpu, 6)))


def shards(share: GpuShare, models: tuple[str, ...], cluster: Cluster) -> Shards:
    """The shards of ``share`` on one of ``models`` (none named: every model the map gives shards)."""
    found: dict[str, tuple[int, int]] = {}
    why: list[str] = []
    for model in models or tuple(cluster.shards):
        per_gpu, kind = cluster.shards_of(model), cluster.gres_type(model)
        if not per_gpu or kind is None:
            why.append(f"the accelerators map of the Slurm connection {cluster.name!r} gives {model} no shards")
            continue
        count = _count(share, model, per_gpu)
        if isinstance(count, str):
            why.append(count)
        else:
            found[kind] = (count, per_gpu)
    if not found:
        raise GpuTaskError(
            f"A share of {share.describe()} of one GPU cannot be asked of Slurm: {'; '.join(why) or 'no model'}. "
            'The admin maps each model to {"gres": TYPE, "shards": N} in the connection (docs/slurm.md), or give '
            "the task a whole GPU (gpu_count=1)."
        )
    if len(set(found.values())) > 1:
        sizes = ", ".join(f"{kind}: {count} of {per_gpu}" for kind, (count, per_gpu) in found.items())
        raise GpuTaskError(
            f"A share of {share.describe()} of one GPU is a different number of shards on each model ({sizes}): "
            "name one model (accelerator=)."
        )
    (count, per_gpu), *_ = found.values()
    return Shards(count, per_gpu, tuple(found))


def taken(
    share: GpuShare, models: tuple[str, ...], cluster: Cluster, need: int | None
) -> tuple[GpuShare, Shards, str | None]:
    """The share a job asks for, its shards, and a right-sized try's log line.

    :param need: a right-sized try's bytes (``telemetry/right_size.py``), or ``None``: the declared share. Where no
        model the task may run on holds it in shards, the declared share stays (as on a host: ``host/inventory.py``).
    """
    if need is None:
        return share, shards(share, models, cluster), None
    sized = GpuShare(memory=need)
    try:
        found = shards(sized, models, cluster)
    except GpuTaskError:
        why = f"right_size: no GPU the task may run on holds {format_bytes(need)}: the share stays {share.describe()}"
        return share, shards(share, models, cluster), why
    return sized, found, f"right_size: a share of {format_bytes(need)} instead of {share.describe()}"


def enforcement(share: GpuShare, taken: Shards, *, command: bool, allow_unenforced: bool) -> Enforcement:
    """How the share is enforced in the job (the runtime reads ``Enforcement.share``: the cap, the log line)."""
    percent = math.ceil(taken.count * 100 / taken.per_gpu)
    where = f"{share.describe()} of one {' or '.join(taken.types)} GPU ({taken.count} of its {taken.per_gpu} shards)"
    facts = {"memory": share.memory, "fraction": share.fraction, "percent": percent, "gpu": "Slurm gres/shard"}
    return without_mps(where, facts, WHY, command=command, allow_unenforced=allow_unenforced)
