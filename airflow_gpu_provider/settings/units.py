"""Byte and CPU quantities, parsed once into numbers.

The suffix table is one enum (as ZenML's ``ByteUnit``); the grammar is Kubernetes' quantity grammar
(``16Gi``, ``16G``, ``500m``) plus the byte forms DAG authors write (``16GB``, ``16GiB``, ``16gb``).
``tests/settings/test_units.py`` checks every Kubernetes form against ``kubernetes.utils.parse_quantity``.
The kubernetes client itself is not imported here: it costs seconds and this module is on the DAG-parse path.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from enum import Enum

from airflow_gpu_provider.runtime.protocol import format_bytes  # noqa: F401 - the one bytes formatter, the runtime's too
from airflow_gpu_provider.settings.grammar import QUANTITY


class Unit(Enum):
    """A quantity suffix and its multiplier."""

    KI = ("Ki", 1024)
    MI = ("Mi", 1024**2)
    GI = ("Gi", 1024**3)
    TI = ("Ti", 1024**4)
    PI = ("Pi", 1024**5)
    EI = ("Ei", 1024**6)
    MILLI = ("m", Decimal("0.001"))
    K = ("k", 10**3)
    M = ("M", 10**6)
    G = ("G", 10**9)
    T = ("T", 10**12)
    P = ("P", 10**15)
    E = ("E", 10**18)

    def __init__(self, suffix: str, multiplier: int | Decimal) -> None:
        self.suffix = suffix
        self.multiplier = Decimal(multiplier)


# Byte spellings: "GB"/"gb" -> decimal giga, "GiB"/"gib" -> binary gibi (case-insensitive, unambiguous).
_BYTE_SUFFIXES: dict[str, Unit] = {}
for _unit in Unit:
    if _unit is Unit.MILLI:
        continue
    _letter = _unit.suffix[0].upper()
    if _unit.suffix.endswith("i"):
        _BYTE_SUFFIXES[f"{_letter}ib".lower()] = _unit
    else:
        _BYTE_SUFFIXES[f"{_letter}b".lower()] = _unit
_BYTE_SUFFIXES["b"] = None  # type: ignore[assignment]  # plain bytes: "512B"

_K8S_SUFFIXES = {unit.suffix: unit for unit in Unit}
_K8S_SUFFIXES["K"] = Unit.K  # a common spelling of kilo

MIN_CPUS = Decimal("0.001")  # 1m, the smallest Kubernetes CPU quantity; less means "no limit" to Docker
MAX_CPUS = 65536
MIN_MEMORY = 6 * 2**20  # Docker's smallest memory limit
MIN_SHM = 2**20
MAX_BYTES = 2**50  # 1 PiB

BYTES_ACCEPTED = (
    "integer bytes, or a number with a unit: binary Ki, Mi, Gi, Ti, Pi, Ei (also KiB, MiB, GiB, ...), "
    "decimal k, M, G, T, P, E (also KB, MB, GB, ...), e.g. '16Gi', '16GB', '512Mi'"
)
CPU_ACCEPTED = "a number of cores from 0.001 to 65536 (e.g. 4, 0.5) or a Kubernetes CPU quantity (e.g. '500m', '2')"


def parse_quantity(value: str) -> Decimal:
    """Parse a quantity string (``16Gi``, ``16GB``, ``500m``) into a Decimal.

    :raises ValueError: when the text is not a quantity.
    """
    match = QUANTITY.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r} is not a number with an optional unit")
    try:
        number = Decimal(match["number"])
    except InvalidOperation as err:  # pragma: no cover - the regex only admits decimals
        raise ValueError(f"{value!r} is not a number") from err
    suffix = match["suffix"]
    if not suffix:
        return number
    if suffix in _K8S_SUFFIXES:
        return number * _K8S_SUFFIXES[suffix].multiplier
    if suffix.lower() in _BYTE_SUFFIXES:
        unit = _BYTE_SUFFIXES[suffix.lower()]
        return number if unit is None else number * unit.multiplier
    raise ValueError(f"unknown unit {suffix!r}")


def parse_bytes(value: int | str) -> int:
    """Return a byte count from integer bytes or a quantity string; fractions round up, like Kubernetes.

    :raises ValueError: for negative, non-numeric or unit-less-but-fractional input.
    :raises TypeError: for other types.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"expected int or str, got {type(value).__name__}")
    if isinstance(value, int):
        amount = Decimal(value)
    else:
        amount = parse_quantity(value)
        if value.strip().endswith("m"):
            raise ValueError("milli-bytes ('m') are not a memory size")
    if amount < 0:
        raise ValueError("must not be negative")
    return math.ceil(amount)


def parse_cpu(value: int | float | str) -> float:
    """Return a CPU count from a number or a Kubernetes CPU quantity (``500m`` is 0.5)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"expected a number or str, got {type(value).__name__}")
    try:
        amount = Decimal(str(value)) if not isinstance(value, str) else parse_quantity(value)
    except InvalidOperation:
        raise ValueError("not a number") from None
    if not amount.is_finite() or amount <= 0:
        raise ValueError("must be a positive number")
    if not MIN_CPUS <= amount <= MAX_CPUS:
        raise ValueError(f"out of range ({MIN_CPUS} to {MAX_CPUS} cores)")
    return float(amount)


def format_k8s_bytes(amount: int) -> str:
    """Format bytes as the shortest exact Kubernetes quantity: ``17179869184`` -> ``16Gi``, ``16e9`` -> ``16G``."""
    candidates = [str(amount)]
    for family in (
        (Unit.EI, Unit.PI, Unit.TI, Unit.GI, Unit.MI, Unit.KI),
        (Unit.E, Unit.P, Unit.T, Unit.G, Unit.M, Unit.K),
    ):
        unit = next((u for u in family if amount and amount % int(u.multiplier) == 0), None)
        if unit is not None:
            candidates.append(f"{amount // int(unit.multiplier)}{unit.suffix}")
    return min(candidates, key=len)


def format_k8s_cpu(cores: float) -> str:
    """Format cores as a Kubernetes CPU quantity: ``2.0`` -> ``2``, ``0.5`` -> ``500m``."""
    millis = Decimal(str(cores)) * 1000
    if millis % 1000 == 0:
        return str(int(millis // 1000))
    return f"{int(millis.to_integral_value(rounding='ROUND_CEILING'))}m"
