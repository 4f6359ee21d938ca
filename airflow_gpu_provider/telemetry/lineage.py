"""The ``gpu`` OpenLineage run facet: devices, peak memory, utilisation and GPU-seconds of a task try.

Only when the OpenLineage provider is installed: its listener asks the operator for facets
(``get_openlineage_facets_on_complete`` / ``_on_failure``, :class:`LineageMixin`); without it nothing is imported
and nothing changes.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_gpu_provider.telemetry.profile import Profile

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


def gpu_facet(profile: Profile) -> Any:
    """The facet of a completed profile (:func:`.report.complete`)."""
    devices = [
        {
            "index": d.index,
            "uuid": d.uuid,
            "name": d.name,
            "memory_total": d.memory_total,
            "peak_memory": d.peak_memory,
            "mean_util": d.mean_util,
        }
        for d in profile.devices
    ]
    peak, mean = profile.peak_memory, profile.mean_util
    return facet_class()(
        kind=profile.kind,
        host=profile.host,
        devices=devices,
        durationSeconds=float(profile.duration_s or 0),
        gpuSeconds=float(profile.gpu_seconds or 0),
        peakMemoryBytes=None if peak is None else int(peak),
        meanUtilization=None if mean is None else round(mean, 1),
    )


class LineageMixin:
    """The operator's OpenLineage methods: the ``gpu`` run facet of the try's profile (``self.gpu_profile``)."""

    gpu_profile: dict[str, Any] | None = None

    def _lineage(self) -> Any:
        from airflow.providers.openlineage.extractors import OperatorLineage

        from airflow_gpu_provider.telemetry.profile import Profile  # when a try ends, not at DAG parse

        profile = Profile.read(self.gpu_profile)
        if profile is None:
            return OperatorLineage()
        return OperatorLineage(run_facets={"gpu": gpu_facet(profile)})

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The ``gpu`` run facet of a successful try."""
        return self._lineage()

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """The ``gpu`` run facet of a failed try (an OOM's profile is the one that explains it)."""
        return self._lineage()
