"""The NVML replay is a faithful NVML: the real library's C API, structs and return codes, answering row after row
what the recording says. Each check runs in a new process started with the replay's environment, the only way the
dynamic loader finds it, exactly as the provider's runtime and its sampler will load NVML.

Expected values are read from the recordings here, independently of the C parser.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from nvml_replay import LIBRARY, RECORDINGS, ReplayBuildError, build, built_or_skip, replay_environment

ONE_GPU = RECORDINGS / "rtx4090_1gpu.csv"
TWO_GPUS = RECORDINGS / "rtx4090_rtx4080_2gpu.csv"
SUCCESS, UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND, INSUFFICIENT_SIZE = 0, 1, 2, 3, 6, 7
LIBRARY_NOT_FOUND, VERSION_MISMATCH = 12, 25
MIB = 2**20

# What a sampler does, in C terms: the structs of nvml.h, every call's return code and value.
CTYPES = """
import ctypes, json

class Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

class MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

nvml = ctypes.CDLL("libnvidia-ml.so.1")
nvml.nvmlErrorString.restype = ctypes.c_char_p

def handle(index):
    device = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(device)) == 0
    return device

def read(function, *args, kind=ctypes.c_uint):
    value = kind()
    code = function(*args, ctypes.byref(value))
    return [code, value.value if code == 0 else None]

def sample(device):
    utilization = Utilization()
    code = nvml.nvmlDeviceGetUtilizationRates(device, ctypes.byref(utilization))
    memory = Memory()
    memory_code = nvml.nvmlDeviceGetMemoryInfo(device, ctypes.byref(memory))
    return {
        "utilization": [code, [utilization.gpu, utilization.memory] if code == 0 else None],
        "memory": [memory_code, [memory.total, memory.used, memory.free] if memory_code == 0 else None],
        "power": read(nvml.nvmlDeviceGetPowerUsage, device),
        "temperature": read(nvml.nvmlDeviceGetTemperature, device, 0),
        "clock": read(nvml.nvmlDeviceGetClockInfo, device, 1),
        "energy": read(nvml.nvmlDeviceGetTotalEnergyConsumption, device, kind=ctypes.c_ulonglong),
    }
"""


@pytest.fixture(scope="session")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_or_skip(tmp_path_factory.mktemp("nvml-replay"))


def python(code: str, recording: Path | None, lib_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new Python whose NVML is the replay of ``recording`` (``None``: no recording named)."""
    environment = {**os.environ, **replay_environment(recording or Path("unused"), lib_dir)}
    if recording is None:
        del environment["NVML_REPLAY_FILE"]
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=environment, capture_output=True, text=True, timeout=60
    )


def run(code: str, recording: Path, lib_dir: Path) -> Any:
    """What ``code`` printed last, as JSON, run with the replay of ``recording``."""
    done = python(code, recording, lib_dir)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def recorded(recording: Path) -> list[list[dict[str, str]]]:
    """Each device's rows, devices in order of first appearance, values as written."""
    with recording.open() as file:
        rows = [
            {name.split(" [")[0]: value for name, value in row.items()}
            for row in csv.DictReader(file, skipinitialspace=True)
        ]
    devices: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        devices.setdefault(row["index"], []).append(row)
    return list(devices.values())


def expected_samples(rows: list[dict[str, str]], samples: int) -> list[dict[str, Any]]:
    """What NVML must answer to ``samples`` samples of one device: a row each, then the last row again."""

    def number(value: str, scale: float = 1) -> list[Any]:
        return [NOT_SUPPORTED, None] if value == "[N/A]" else [SUCCESS, int(float(value) * scale + 0.5)]

    energy, answers = [0.0], []  # in the C code's order of operations: the same doubles
    for last, row in zip(rows, rows[1:]):
        elapsed = (_time(row) - _time(last)) / timedelta(milliseconds=1)
        power = float(last["power.draw"]) * 1000 + float(row["power.draw"]) * 1000
        energy.append(energy[-1] + power / 2 * elapsed / 1000)
    for i in range(samples):
        row = rows[min(i, len(rows) - 1)]
        answers.append(
            {
                "utilization": [SUCCESS, [int(row["utilization.gpu"]), int(row["utilization.memory"])]],
                "memory": [SUCCESS, memory(row)],
                "power": number(row["power.draw"], 1000),
                "temperature": number(row["temperature.gpu"]),
                "clock": number(row["clocks.sm"]),
                "energy": [SUCCESS, int(energy[min(i, len(rows) - 1)] + 0.5)],
            }
        )
    return answers


def _time(row: dict[str, str]) -> datetime:
    return datetime.strptime(row["timestamp"], "%Y/%m/%d %H:%M:%S.%f")


def memory(row: dict[str, str]) -> list[int]:
    """A row's memory as NVML gives it: total, used, free, in bytes."""
    total, used = int(row["memory.total"]) * MIB, int(row["memory.used"]) * MIB
    return [total, used, total - used]


@pytest.mark.parametrize("recording", [ONE_GPU, TWO_GPUS], ids=lambda path: path.stem)
def test_pynvml_reads_the_recorded_gpus(recording: Path, lib_dir: Path) -> None:
    found = run(
        """
        import json, pynvml
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        gpus = []
        for handle in handles:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            by_uuid = pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid))
            gpus.append([pynvml.nvmlDeviceGetName(handle), uuid, by_uuid, memory.total, memory.used, memory.free])
        print(json.dumps([pynvml.nvmlSystemGetDriverVersion(), gpus]))
        pynvml.nvmlShutdown()
        """,
        recording,
        lib_dir,
    )
    first_rows = [rows[0] for rows in recorded(recording)]
    assert found == [
        "replay",
        [[row["name"], row["uuid"], i, *memory(row)] for i, row in enumerate(first_rows)],
    ]


def test_pynvml_reads_the_recovery_action_field_row_by_row(lib_dir: Path) -> None:
    """NVIDIA's own binding (nvidia-ml-py) reads NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: the struct layout is nvml.h's."""
    found = run(
        """
        import json, pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(1)
        answers = []
        for _ in range(4):
            pynvml.nvmlDeviceGetUtilizationRates(handle)  # the next row
            action, other = pynvml.nvmlDeviceGetFieldValues(
                handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, pynvml.NVML_FI_DEV_RESET_STATUS]
            )
            answers.append([action.fieldId, action.nvmlReturn, action.valueType, action.value.uiVal, other.nvmlReturn])
        print(json.dumps(answers))
        pynvml.nvmlShutdown()
        """,
        RECORDINGS / "rtx4090_rtx4080_2gpu_xid94.csv",
        lib_dir,
    )
    import pynvml

    none, reset = pynvml.NVML_GPU_RECOVERY_ACTION_NONE, pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    expected = [[230, SUCCESS, 1, action, NOT_SUPPORTED] for action in (none, none, reset, reset)]
    assert found == expected  # GPU 1's recording: none until its third tick, then GPU reset


@pytest.mark.parametrize("recording", [ONE_GPU, TWO_GPUS], ids=lambda path: path.stem)
def test_each_utilisation_call_reads_the_next_row_of_its_device(recording: Path, lib_dir: Path) -> None:
    devices = recorded(recording)
    samples = max(len(rows) for rows in devices) + 3  # past the end: the last row stays
    found = run(
        CTYPES
        + f"""
assert nvml.nvmlInit_v2() == 0
devices = [handle(i) for i in range({len(devices)})]
print(json.dumps([[sample(device) for device in devices] for _ in range({samples})]))
""",
        recording,
        lib_dir,
    )
    for i, rows in enumerate(devices):
        assert [tick[i] for tick in found] == expected_samples(rows, samples)


SYNTHETIC = """\
timestamp, index, uuid, name, utilization.gpu [%], utilization.memory [%], memory.used [MiB], memory.total [MiB], \
power.draw [W], temperature.gpu, clocks.sm [MHz]
2025/12/31 23:59:59.500, 3, GPU-synthetic-3, Synthetic test GPU, 10, 5, 100, 1000, 100.00, 30, 1410
2026/01/01 00:00:00.500, 3, GPU-synthetic-3, Synthetic test GPU, [N/A], 5, 100, 1000, [N/A], 31, [N/A]
2026/01/01 00:00:02.000, 3, GPU-synthetic-3, Synthetic test GPU, 30, 6, 200, 1000, 300.00, [N/A], 1980
"""


def test_na_fields_are_not_supported_and_only_the_sm_clock_is_recorded(tmp_path: Path, lib_dir: Path) -> None:
    recording = tmp_path / "synthetic.csv"  # made up here, to put [N/A] where a test needs it
    recording.write_text(SYNTHETIC)
    found = run(
        CTYPES
        + """
assert nvml.nvmlInit_v2() == 0
device = handle(0)
samples = [sample(device) for _ in range(3)]
others = [read(nvml.nvmlDeviceGetClockInfo, device, kind)[0] for kind in (0, 2, 3, 4)]
print(json.dumps([samples, others, read(nvml.nvmlDeviceGetTemperature, device, 1)[0]]))
""",
        recording,
        lib_dir,
    )
    samples, others, other_sensor = found
    assert [s["utilization"] for s in samples] == [[SUCCESS, [10, 5]], [NOT_SUPPORTED, None], [SUCCESS, [30, 6]]]
    assert [s["clock"] for s in samples] == [[SUCCESS, 1410], [NOT_SUPPORTED, None], [SUCCESS, 1980]]
    assert [s["temperature"] for s in samples] == [[SUCCESS, 30], [SUCCESS, 31], [NOT_SUPPORTED, None]]
    assert [s["power"] for s in samples] == [[SUCCESS, 100000], [NOT_SUPPORTED, None], [SUCCESS, 300000]]
    # energy: unknown where the power is, and integrated across that row: (100 W + 300 W) / 2 x 2.5 s
    assert [s["energy"] for s in samples] == [[SUCCESS, 0], [NOT_SUPPORTED, None], [SUCCESS, 500_000]]
    assert others == [NOT_SUPPORTED, NOT_SUPPORTED, NOT_SUPPORTED, INVALID_ARGUMENT]
    assert other_sensor == INVALID_ARGUMENT


def test_the_api_answers_wrong_calls_as_nvml_does(lib_dir: Path) -> None:
    found = run(
        CTYPES
        + """
answers = {"before init": read(nvml.nvmlDeviceGetCount_v2)[0]}
assert nvml.nvmlInit() == 0 and nvml.nvmlInitWithFlags(0) == 0  # counted: two shutdowns to close
device = handle(1)
small = ctypes.create_string_buffer(8)
answers["small buffer"] = nvml.nvmlDeviceGetUUID(device, small, 8)
answers["index out of range"] = nvml.nvmlDeviceGetHandleByIndex_v2(2, ctypes.byref(ctypes.c_void_p()))
answers["unknown uuid"] = nvml.nvmlDeviceGetHandleByUUID(b"GPU-none", ctypes.byref(ctypes.c_void_p()))
answers["null output"] = nvml.nvmlDeviceGetPowerUsage(device, None)
answers["v1 count"] = read(nvml.nvmlDeviceGetCount)
answers["index"] = read(nvml.nvmlDeviceGetIndex, device)
memory = MemoryV2(version=0)
answers["memory v2, no version"] = nvml.nvmlDeviceGetMemoryInfo_v2(device, ctypes.byref(memory))
memory.version = ctypes.sizeof(MemoryV2) | 2 << 24
answers["memory v2"] = [nvml.nvmlDeviceGetMemoryInfo_v2(device, ctypes.byref(memory)), memory.total, memory.reserved,
                        memory.used, memory.free]
answers["shutdowns"] = [nvml.nvmlShutdown(), read(nvml.nvmlDeviceGetCount_v2)[0], nvml.nvmlShutdown(),
                        read(nvml.nvmlDeviceGetCount_v2)[0], nvml.nvmlShutdown()]
answers["strings"] = [nvml.nvmlErrorString(code).decode() for code in (0, 3, 12)]
print(json.dumps(answers))
""",
        TWO_GPUS,
        lib_dir,
    )
    total, used, free = memory(recorded(TWO_GPUS)[1][0])
    assert found == {
        "before init": UNINITIALIZED,
        "small buffer": INSUFFICIENT_SIZE,
        "index out of range": INVALID_ARGUMENT,
        "unknown uuid": NOT_FOUND,
        "null output": INVALID_ARGUMENT,
        "v1 count": [SUCCESS, 2],
        "index": [SUCCESS, 1],
        "memory v2, no version": VERSION_MISMATCH,
        "memory v2": [SUCCESS, total, 0, used, free],
        "shutdowns": [SUCCESS, SUCCESS, SUCCESS, UNINITIALIZED, UNINITIALIZED],
        "strings": ["Success", "Not Supported", "NVML Shared Library Not Found"],
    }


@pytest.mark.parametrize("problem", ["unset", "missing", "not a recording"])
def test_init_fails_loudly_without_a_readable_recording(problem: str, tmp_path: Path, lib_dir: Path) -> None:
    path = tmp_path / "recording.csv"  # "missing": never written
    if problem == "not a recording":
        path.write_text("timestamp, index, name\n2026/01/01 00:00:00.000, 0, GPU\n")
    recording = None if problem == "unset" else path
    done = python("import ctypes; print(ctypes.CDLL('libnvidia-ml.so.1').nvmlInit_v2())", recording, lib_dir)
    assert (done.stdout.strip(), "nvml_replay:" in done.stderr) == (str(LIBRARY_NOT_FOUND), True)
    done = python(
        """
        import pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            print("refused")
        """,
        recording,
        lib_dir,
    )
    assert done.stdout.strip() == "refused"


def test_the_provider_inventory_lists_the_recorded_gpus(lib_dir: Path) -> None:
    found = run(
        """
        import json
        from airflow_gpu_provider.host.inventory import host_devices
        from airflow_gpu_provider.runtime.cuda import list_gpus
        devices = [[d.id, d.name, d.memory_total] for d in host_devices("auto")]
        print(json.dumps([list_gpus(), devices]))
        """,
        TWO_GPUS,
        lib_dir,
    )
    first_rows = [rows[0] for rows in recorded(TWO_GPUS)]
    assert found == [
        [
            {"index": str(i), "uuid": row["uuid"], "name": row["name"], "memory_total": total, "memory_used": used}
            for i, row in enumerate(first_rows)
            for total, used, _ in [memory(row)]
        ],
        [[row["uuid"], row["name"], memory(row)[0]] for row in first_rows],
    ]


def test_build_keeps_the_library_while_the_source_is_unchanged(
    lib_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (LIBRARY, f"{LIBRARY}.sha256"):
        shutil.copy(lib_dir / name, tmp_path / name)
    monkeypatch.setattr(shutil, "which", lambda _: None)  # no gcc from here on
    assert build(tmp_path) == tmp_path
    (tmp_path / f"{LIBRARY}.sha256").write_text("an older source")
    with pytest.raises(ReplayBuildError, match="needs gcc"):
        build(tmp_path)
