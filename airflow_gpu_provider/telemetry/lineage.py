"""The ``gpu`` OpenLineage run facet: devices, peak memory, utilisation and GPU-seconds of a task try.

Only when the OpenLineage provider is installed: its listener asks the operator for facets
(``get_openlineage_facets_on_complete`` / ``_on_failure``, :class:`LineageMixin`); without it nothing is imported
and nothing changes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

SCHEMA_URL = (
    "https://github.com/airflow-gpu-provider/airflow-gpu-provider/blob/main/docs/telemetry.md#the-gpu-run-facet"
)


@functools.cache
def facet_class() -> type[Any]:
    """The facet's attrs class, built on the OpenLineage client's ``RunFacet`` when first asked for."""
    from airflow.providers.common.compat.openlineage.facet import RunFacet
    from attrs import define

    @define
    class GpuRunFacet(RunFacet):  # type: ignore[misc]
        """GPU use of one task try, from the provider's profile (``docs/telemetry.md``)."""

        kind: str
        host: str
        devices: list[dict[str, Any]]
        durationSeconds: float
        gpuSeconds: float
        peakMemoryBytes: int | None
        meanUtilization: float | None

        @staticmethod
        def _get_schema() -> str:
            return SCHEMA_URL

    return GpuRunFacet


def gpu_facet(profile: Mapping[str, Any]) -> Any:
    """The facet of a completed profile (:func:`.report.complete`)."""
    devices = [
        {key: device.get(key) for key in ("index", "uuid", "name", "memory_total", "peak_memory", "mean_util")}
        for device in profile.get("devices") or []
    ]
    peaks = [d["peak_memory"] for d in devices if d["peak_memory"] is not None]
    means = [d["mean_util"] for d in devices if d["mean_util"] is not None]
    return facet_class()(
        kind=str(profile.get("kind")),
        host=str(profile.get("host")),
        devices=devices,
        durationSeconds=float(profile.get("duration_s") or 0),
        gpuSeconds=float(profile.get("gpu_seconds") or 0),
        peakMemoryBytes=int(max(peaks)) if peaks else None,
        meanUtilization=round(sum(means) / len(means), 1) if means else None,
    )


class LineageMixin:
    """The operator's OpenLineage methods: the ``gpu`` run facet of the try's profile (``self.gpu_profile``)."""

    gpu_profile: dict[str, Any] | None = None

    def _lineage(self) -> Any:
        from airflow.providers.openlineage.extractors import OperatorLineage

        if not self.gpu_profile:
            return OperatorLineage()
        return OperatorLineage(run_facets={"gpu": gpu_facet(self.gpu_profile)})

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The ``gpu`` run facet of a successful try."""
        return self._lineage()

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """The ``gpu`` run facet of a failed try (an OOM's profile is the one that explains it)."""
        return self._lineage()
