"""The task's visible GPUs through NVML, called with ``ctypes``: no nvidia-ml-py needed in the image."""

from __future__ import annotations

import os
from typing import Any

NVML_LIBRARY = "libnvidia-ml.so.1"  # mounted into GPU containers by the NVIDIA container toolkit
NO_DEVICES = ("", "-1", "none", "void", "nodevfiles")  # CUDA_VISIBLE_DEVICES values that name no device


class Nvml:
    """The task's visible GPUs through NVML, called with ``ctypes`` (no nvidia-ml-py in the image).

    Visible means ``CUDA_VISIBLE_DEVICES`` (UUIDs or indices, as CUDA reads it), or every device NVML shows (in a
    container, the ones it was given).
    """

    def __init__(self) -> None:
        import ctypes

        class Utilization(ctypes.Structure):
            _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

        class Memory(ctypes.Structure):
            _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

        self.ctypes, self.utilization, self.memory = ctypes, Utilization, Memory
        self.lib = ctypes.CDLL(NVML_LIBRARY)
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        self._call("nvmlInit_v2")
        try:
            self.devices = self._visible()
        except BaseException:
            self.close()
            raise

    def _call(self, name: str, *args: Any) -> None:
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise OSError(f"{name}: {self.lib.nvmlErrorString(status).decode(errors='replace')} ({status})")

    def _read(self, name: str, handle: Any, *args: Any) -> int | None:
        """One ``unsigned int`` metric, or ``None`` where the device does not report it (a MIG slice's power)."""
        value = self.ctypes.c_uint()
        status = getattr(self.lib, name)(handle, *args, self.ctypes.byref(value))
        return int(value.value) if status == 0 else None

    def _visible(self) -> list[tuple[dict[str, Any], Any]]:
        c = self.ctypes
        wanted = os.environ.get("CUDA_VISIBLE_DEVICES")
        if wanted is None:
            count = c.c_uint()
            self._call("nvmlDeviceGetCount_v2", c.byref(count))
            ids = [str(i) for i in range(count.value)]
        elif wanted.strip().lower() in NO_DEVICES:
            ids = []
        else:
            ids = [part.strip() for part in wanted.split(",")]
        devices = []
        for position, device_id in enumerate(ids):
            handle = c.c_void_p()
            if device_id.isdigit():
                status = self.lib.nvmlDeviceGetHandleByIndex_v2(c.c_uint(int(device_id)), c.byref(handle))
            else:
                status = self.lib.nvmlDeviceGetHandleByUUID(device_id.encode(), c.byref(handle))
            if status != 0:
                break  # as CUDA: the devices before the first id that names none
            text = c.create_string_buffer(96)
            name = text.value.decode() if self.lib.nvmlDeviceGetName(handle, text, 96) == 0 else "?"
            uuid = text.value.decode() if self.lib.nvmlDeviceGetUUID(handle, text, 96) == 0 else device_id
            index = self._read("nvmlDeviceGetIndex", handle)
            memory = self.memory()
            total = memory.total if self.lib.nvmlDeviceGetMemoryInfo(handle, c.byref(memory)) == 0 else None
            info = {"index": str(position if index is None else index), "uuid": uuid, "name": name}
            devices.append(({**info, "memory_total": total}, handle))
        return devices

    def sample(self) -> list[list[float | None]]:
        """Per device, the :data:`~.stats.METRICS` now (utilisation first: it is the sampling period's)."""
        c, rows = self.ctypes, []
        for _, handle in self.devices:
            utilization, memory = self.utilization(), self.memory()
            util = (
                utilization.gpu if self.lib.nvmlDeviceGetUtilizationRates(handle, c.byref(utilization)) == 0 else None
            )
            used = memory.used if self.lib.nvmlDeviceGetMemoryInfo(handle, c.byref(memory)) == 0 else None
            power = self._read("nvmlDeviceGetPowerUsage", handle)
            temperature = self._read("nvmlDeviceGetTemperature", handle, c.c_int(0))  # NVML_TEMPERATURE_GPU
            clock = self._read("nvmlDeviceGetClockInfo", handle, c.c_int(1))  # NVML_CLOCK_SM
            rows.append([util, used, None if power is None else power / 1000, temperature, clock])
        return rows

    def energy_joules(self) -> list[float | None]:
        """Per device, the energy counter (J since the driver loaded; ``None`` before Volta)."""
        value, energies = self.ctypes.c_ulonglong(), []
        for _, handle in self.devices:
            ok = self.lib.nvmlDeviceGetTotalEnergyConsumption(handle, self.ctypes.byref(value)) == 0
            energies.append(value.value / 1000 if ok else None)
        return energies

    def close(self) -> None:
        """Release NVML."""
        self.lib.nvmlShutdown()
