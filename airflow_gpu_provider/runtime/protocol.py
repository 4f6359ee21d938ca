"""TEMPORARY shim until the runtime package lands (branch issue18-runtime): the protocol's names."""

from airflow_gpu_provider.runtime.bootstrap import (  # noqa: F401
    CHECKPOINT_ENV,
    ENVELOPE_VERSION,
    GPU_OOM,
    HOST_OOM,
    RESULT_MARKER,
    RESULT_TO_LOG,
    redact,
    split_credentials,
    uv_ca_variable,
)

ERROR = "error"


def format_bytes(amount: float | None) -> str:
    """TEMPORARY: the one bytes formatter (``17179869184`` -> ``16.0 GiB``; ``?`` when unknown)."""
    if amount is None:
        return "?"
    value = float(amount)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
