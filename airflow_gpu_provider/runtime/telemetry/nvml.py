"""The task's visible GPUs through NVML, called with ``ctypes``: no nvidia-ml-py needed in the image.

Besides the metrics, :meth:`Nvml.faults` reports what says a GPU failed: Xid errors (NVML's critical Xid events,
registered for each device), each with the GPU's recovery action when the driver gives it, and a rise of its
volatile uncorrectable ECC error count since the sampling started.
"""

from __future__ import annotations

import os
from typing import Any

NVML_LIBRARY = "libnvidia-ml.so.1"  # mounted into GPU containers by the NVIDIA container toolkit
NO_DEVICES = ("", "-1", "none", "void", "nodevfiles")  # CUDA_VISIBLE_DEVICES values that name no device
XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
UNCORRECTED, VOLATILE = 1, 0  # nvmlMemoryErrorType_t NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvmlEccCounterType_t
# nvml.h's NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (drivers from R570; nvidia-ml-py 13.615: pynvml.py), read with
# nvmlDeviceGetFieldValues; its value is an nvmlDeviceGpuRecoveryAction_t (NVML_GPU_RECOVERY_ACTION_*)
RECOVERY_ACTION_FIELD = 230
RECOVERY_ACTIONS = (
    "none", "GPU reset", "node reboot", "drain P2P", "drain and reset", "recover IMEX domain", "bus reset",
    "system reboot",
)  # fmt: skip


def none_visible() -> bool:
    """The task was given no GPU: NVML is not loaded at all.

    ``CUDA_VISIBLE_DEVICES`` names none, or ``NVIDIA_VISIBLE_DEVICES=void``: the provider's container or pod with no
    NVIDIA device.
    """
    wanted = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (wanted is not None and wanted.strip().lower() in NO_DEVICES) or os.environ.get(
        "NVIDIA_VISIBLE_DEVICES"
    ) == "void"


UNSIGNED_INT, UNSIGNED_LONG, UNSIGNED_LONG_LONG, SIGNED_LONG_LONG, SIGNED_INT = 1, 2, 3, 4, 5  # nvmlValueType_t


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

        class EventData(ctypes.Structure):  # nvmlEventData_t
            _fields_ = [
                ("device", ctypes.c_void_p),
                ("eventType", ctypes.c_ulonglong),
                ("eventData", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint),
            ]

        class Value(ctypes.Union):  # nvmlValue_t
            _fields_ = [
                ("dVal", ctypes.c_double),
                ("uiVal", ctypes.c_uint),
                ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong),
                ("sllVal", ctypes.c_longlong),
                ("siVal", ctypes.c_int),
                ("usVal", ctypes.c_ushort),
            ]

        class FieldValue(ctypes.Structure):  # nvmlFieldValue_t
            _fields_ = [
                ("fieldId", ctypes.c_uint32),
                ("scopeId", ctypes.c_uint32),
                ("timestamp", ctypes.c_int64),
                ("latencyUsec", ctypes.c_int64),
                ("valueType", ctypes.c_uint),
                ("nvmlReturn", ctypes.c_uint),
                ("value", Value),
            ]

        self.ctypes, self.utilization, self.memory, self.event_data = ctypes, Utilization, Memory, EventData
        self.field_value = FieldValue
        self.lib = ctypes.CDLL(NVML_LIBRARY)
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        self._call("nvmlInit_v2")
        self.event_set: Any = None
        try:
            self.devices = self._visible()
            self.event_set = self._watch_xids()
            self.ecc_seen = [self._ecc(handle) for _, handle in self.devices]
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
        elif none_visible():
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

    def _watch_xids(self) -> Any:
        """An event set that receives the devices' critical Xid events; ``None`` where NVML has none to give."""
        c = self.ctypes
        event_set = c.c_void_p()
        if not all(hasattr(self.lib, name) for name in ("nvmlEventSetCreate", "nvmlEventSetWait_v2")):
            return None  # a driver older than NVML's _v2 wait: no Xid events, the metrics still
        if self.lib.nvmlEventSetCreate(c.byref(event_set)):
            return None
        for _, handle in self.devices:  # a device without Xid events (NOT_SUPPORTED) is left out
            self.lib.nvmlDeviceRegisterEvents(handle, c.c_ulonglong(XID_CRITICAL_ERROR), event_set)
        return event_set

    def _ecc(self, handle: Any) -> int | None:
        """The device's volatile uncorrectable ECC error count; ``None`` without ECC (most consumer cards)."""
        count = self.ctypes.c_ulonglong()
        status = self.lib.nvmlDeviceGetTotalEccErrors(handle, UNCORRECTED, VOLATILE, self.ctypes.byref(count))
        return int(count.value) if status == 0 else None

    def recovery_action(self, handle: Any) -> str | None:
        """What the driver says the GPU needs now (``"none"``, ``"GPU reset"``, ...); ``None`` where it does not say.

        NVIDIA's Xid catalogue: the recovery action, where the driver gives it, is what decides (Xid 154 reports
        its changes).
        """
        if not hasattr(self.lib, "nvmlDeviceGetFieldValues"):
            return None
        value = self.field_value(fieldId=RECOVERY_ACTION_FIELD)
        if self.lib.nvmlDeviceGetFieldValues(handle, self.ctypes.c_int(1), self.ctypes.byref(value)) != 0:
            return None
        kinds = {UNSIGNED_INT: "uiVal", UNSIGNED_LONG: "ulVal", UNSIGNED_LONG_LONG: "ullVal"}
        kinds.update({SIGNED_LONG_LONG: "sllVal", SIGNED_INT: "siVal"})
        if value.nvmlReturn != 0 or value.valueType not in kinds:
            return None
        action = int(getattr(value.value, kinds[value.valueType]))
        return RECOVERY_ACTIONS[action] if 0 <= action < len(RECOVERY_ACTIONS) else f"recovery action {action}"

    def faults(self) -> list[dict[str, Any]]:
        """What says a GPU failed since the last call: its Xid events, a rise of its uncorrectable ECC count.

        An Xid event carries the GPU's recovery action when the driver gives it (:meth:`recovery_action`).
        """
        found: list[dict[str, Any]] = []
        by_handle = {handle.value: (info, handle) for info, handle in self.devices}
        data = self.event_data()
        while (
            self.event_set is not None and self.lib.nvmlEventSetWait_v2(self.event_set, self.ctypes.byref(data), 0) == 0
        ):
            info, handle = by_handle.get(data.device) or ({}, None)
            fault = {"index": info.get("index"), "uuid": info.get("uuid"), "xid": int(data.eventData)}
            action = None if handle is None else self.recovery_action(handle)
            found.append(fault if action is None else {**fault, "recovery_action": action})
        for position, (info, handle) in enumerate(self.devices):
            count, before = self._ecc(handle), self.ecc_seen[position]
            if count is not None and before is not None and count > before:
                found.append({"index": info["index"], "uuid": info["uuid"], "ecc_uncorrected": count - before})
            self.ecc_seen[position] = count if count is not None else before
        return found

    def close(self) -> None:
        """Release NVML."""
        if self.event_set is not None:
            self.lib.nvmlEventSetFree(self.event_set)
        self.lib.nvmlShutdown()
