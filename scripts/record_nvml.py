"""Record this machine's NVIDIA GPUs for the NVML replay of the tests (``tests/nvml_replay``).

    python3 scripts/record_nvml.py SECONDS OUTPUT.csv [--interval-ms 1000]

Runs ``nvidia-smi --query-gpu=... --format=csv,nounits -lms 1000`` for SECONDS and keeps what it wrote: a header,
then one row per GPU per tick. Start the workload to record first (a training run), then this. Standard library
only, so it runs on a bare GPU machine. Add the file to ``tests/nvml_replay/recordings/`` with a line in
its README saying what ran, on which machine.

Exit status: 0 when recorded, 2 without nvidia-smi, 1 when nvidia-smi stopped early or wrote no row.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

QUERY = (
    "timestamp",
    "index",
    "uuid",
    "name",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.total",
    "power.draw",
    "temperature.gpu",
    "clocks.sm",
)
EXIT_FAILED = 1
EXIT_NO_NVIDIA_SMI = 2


def nvidia_smi_command(binary: str, interval_ms: int) -> list[str]:
    """The nvidia-smi command line whose output is a recording."""
    return [binary, f"--query-gpu={','.join(QUERY)}", "--format=csv,nounits", "-lms", str(interval_ms)]


def record(seconds: float, output: Path, *, interval_ms: int = 1000) -> int:
    """Write ``seconds`` of nvidia-smi samples to ``output``; the exit status."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        print("record_nvml: no nvidia-smi on PATH: run this on a machine with an NVIDIA driver", file=sys.stderr)
        return EXIT_NO_NVIDIA_SMI
    with output.open("w") as sink:
        process = subprocess.Popen(nvidia_smi_command(binary, interval_ms), stdout=sink)
        try:
            code = process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            process.terminate()
            process.wait()
            code = None
    text = output.read_text()
    text = text[: text.rfind("\n") + 1]  # a row cut short by the stop is dropped
    output.write_text(text)
    rows = len(text.splitlines()) - 1
    if code is not None or rows < 1:
        print(f"record_nvml: nvidia-smi stopped (status {code}) after {rows} rows; see {output}", file=sys.stderr)
        return EXIT_FAILED
    print(f"record_nvml: {rows} rows in {output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seconds", type=float, help="how long to record")
    parser.add_argument("output", type=Path, help="the recording to write (CSV)")
    parser.add_argument("--interval-ms", type=int, default=1000, help="time between samples (default: 1000)")
    args = parser.parse_args(argv)
    return record(args.seconds, args.output, interval_ms=args.interval_ms)


if __name__ == "__main__":
    sys.exit(main())
