"""scripts/record_nvml.py: the nvidia-smi command it runs and what it keeps, against a stand-in nvidia-smi."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "record_nvml.py"
RECORDING = REPO / "tests" / "nvml_replay" / "recordings" / "rtx4090_1gpu.csv"
QUERY = (
    "--query-gpu=timestamp,index,uuid,name,utilization.gpu,utilization.memory,memory.used,memory.total,"
    "power.draw,temperature.gpu,clocks.sm"
)


def fake_nvidia_smi(folder: Path, body: str) -> Path:
    """An ``nvidia-smi`` in ``folder`` that refuses other arguments than the recorder's, then runs ``body``."""
    script = folder / "nvidia-smi"
    script.write_text(
        f"#!{sys.executable}\nimport sys, time\n"
        f"if sys.argv[1:] != [{QUERY!r}, '--format=csv,nounits', '-lms', '50']:\n"
        "    sys.exit(f'unexpected arguments {sys.argv[1:]}')\n" + body
    )
    script.chmod(0o755)
    return folder


def record(path: Path, output: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "1", str(output), "--interval-ms", "50"],
        env={"PATH": str(path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_keeps_what_nvidia_smi_wrote_less_a_row_cut_short(tmp_path: Path) -> None:
    path = fake_nvidia_smi(
        tmp_path,
        f"sys.stdout.write(open({str(RECORDING)!r}).read() + '2026/01/03 15:38:31.632, 0, GPU-')\n"
        "sys.stdout.flush()\ntime.sleep(60)\n",
    )
    done = record(path, tmp_path / "out.csv")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.csv").read_text() == RECORDING.read_text()
    assert "89 rows" in done.stdout


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (None, 2, "no nvidia-smi on PATH"),
        ("print('Failed to initialize NVML: Driver/library version mismatch')\nsys.exit(9)\n", 1, "status 9"),
    ],
    ids=["no nvidia-smi", "nvidia-smi fails"],
)
def test_fails_without_a_working_nvidia_smi(body: str | None, status: int, message: str, tmp_path: Path) -> None:
    path = tmp_path if body is None else fake_nvidia_smi(tmp_path, body)
    done = record(path, tmp_path / "out.csv")
    assert done.returncode == status
    assert message in done.stderr
