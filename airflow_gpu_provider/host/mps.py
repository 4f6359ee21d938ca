"""How a share of one GPU is enforced, decided once per try and said in its log: MPS, PyTorch's cap, or nothing.

- **MPS** (NVIDIA's Multi-Process Service), where the host runs it: the task is an MPS client with
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M`` (device 0: the one GPU it sees) and
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (its part of the GPU's SMs). The admin's control daemon is used when its
  pipe folder (``CUDA_MPS_PIPE_DIRECTORY``, else ``/tmp/nvidia-mps``) has a ``control`` socket and is root's or the
  worker's and writable by nobody else: a pipe folder another user made could be a daemon of theirs, which would
  see the task's GPU work. Otherwise, where ``nvidia-cuda-mps-control`` is installed and the GPU is named by its
  UUID (NVML's inventory), the provider starts one daemon for the GPU (``-d``, its pipe and log folders in the state
  dir, ``CUDA_VISIBLE_DEVICES`` the GPU's UUID) when its first share is placed, and stops it (``quit``) after its
  last (``host/shares.py`` runs both under the GPU's placement lock). Per-client limits need Volta or later.
- **framework**: the runtime caps PyTorch's CUDA allocator (``torch.cuda.set_per_process_memory_fraction``) before
  the task's function runs (``runtime/share.py``): where MPS is not available, and in containers (an MPS client in
  a container needs the daemon's ``/dev/shm``, i.e. the host's IPC namespace, ``--ipc=host``, which the Docker
  policy refuses by default, rule D3). Only PyTorch's allocations are capped.
- **none**: nothing enforces it (a command; a function without PyTorch): refused unless the admin allows it
  (``[gpu_policy] allow_unenforced_gpu_shares``).

Each protects tasks from each other's mistakes, not from a hostile task: a task's code can unset the variables or
lift the cap before CUDA starts. Between tenants that do not trust each other, use MIG slices or whole GPUs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_gpu_provider.exceptions import GpuUnavailableError
from airflow_gpu_provider.host.inventory import Device
from airflow_gpu_provider.host.shares import GpuDaemon
from airflow_gpu_provider.host.state import private_dir
from airflow_gpu_provider.runtime.protocol import format_bytes
from airflow_gpu_provider.settings.shares import SHARE_PARTS

CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPES = "/tmp/nvidia-mps"  # MPS's own default, trusted only when root's or the worker's
MPS, FRAMEWORK, NONE = "mps", "framework", "none"
_MIB = 2**20

if TYPE_CHECKING:
    from airflow_gpu_provider.host.allocator import Allocation
    from airflow_gpu_provider.task.request import TaskRequest


class Enforcement(NamedTuple):
    """How one try's share is enforced.

    :param kind: :data:`MPS`, :data:`FRAMEWORK` or :data:`NONE`
    :param environment: the task process's variables (MPS)
    :param share: the summary's ``share`` (``runtime/share.py`` reads it: the cap, the log line)
    """

    kind: str
    environment: Mapping[str, str]
    share: Mapping[str, Any]


def admin_pipes(environment: Mapping[str, str] | None = None) -> Path | None:
    """The admin's MPS pipe folder, when a daemon listens there and the folder can be trusted (see the docstring)."""
    folder = Path(
        (environment if environment is not None else os.environ).get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPES
    )
    try:
        info, control = os.lstat(folder), os.lstat(folder / "control")
    except OSError:
        return None
    trusted = stat.S_ISDIR(info.st_mode) and info.st_uid in (0, os.geteuid()) and not info.st_mode & 0o022
    return folder if trusted and stat.S_ISSOCK(control.st_mode) else None


class Daemons:
    """The provider's own MPS control daemons of one host, one per shared GPU (``<state_dir>/mps/<GPU UUID>``).

    :param control: the ``nvidia-cuda-mps-control`` binary
    """

    def __init__(self, state_dir: str | os.PathLike[str], control: str, log: logging.Logger) -> None:
        self.root, self.control, self.log = Path(state_dir) / "mps", control, log

    def pipes(self, device: Device) -> Path:
        """The pipe folder of ``device``'s daemon."""
        return self.root / device.id / "pipe"

    def _run(self, device: Device, *arguments: str, text: str | None = None) -> None:
        folder = self.root / device.id
        environment = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": device.id,
            "CUDA_MPS_PIPE_DIRECTORY": str(private_dir(folder / "pipe")),
            "CUDA_MPS_LOG_DIRECTORY": str(private_dir(folder / "log")),
        }
        subprocess.run([self.control, *arguments], input=text, env=environment, text=True, timeout=60, check=True)

    def start(self, device: Device) -> None:
        """Start ``device``'s daemon unless one runs (a killed worker's is reused)."""
        pid_file = self.pipes(device) / "nvidia-cuda-mps-control.pid"
        with contextlib.suppress(OSError, ValueError):
            if Path(f"/proc/{int(pid_file.read_text().strip())}").exists():
                return
        self.log.info("[gpu] share: starting an MPS control daemon for GPU %s (%s)", device.id, self.pipes(device))
        try:
            self._run(device, "-d")
        except (OSError, subprocess.SubprocessError) as err:
            raise GpuUnavailableError(
                f"The MPS control daemon for GPU {device.id} did not start ({self.control} -d: {err}); its log is in "
                f"{self.root / device.id / 'log'}. Fix MPS on this host, or give the task a whole GPU."
            ) from err

    def stop(self, device: Device) -> None:
        """Stop ``device``'s daemon (its last share ended)."""
        self.log.info("[gpu] share: stopping the MPS control daemon of GPU %s (its last share ended)", device.id)
        try:
            self._run(device, text="quit\n")
        except (OSError, subprocess.SubprocessError) as err:
            self.log.warning("[gpu] share: the MPS daemon of GPU %s did not stop: %s", device.id, err)


class ShareEnforcer:
    """Which enforcement a worker host offers its shares, found once per try (``plan`` decides nothing of it).

    :param in_container: the task runs in a container (MPS is not offered there: see the docstring)
    :param allow_unenforced: ``[gpu_policy] allow_unenforced_gpu_shares``
    """

    def __init__(self, state_dir: str, log: logging.Logger, *, in_container: bool, allow_unenforced: bool) -> None:
        self.log, self.allow_unenforced, self.in_container = log, allow_unenforced, in_container
        self.admin = None if in_container else admin_pipes()
        control = None if in_container or self.admin is not None else shutil.which(CONTROL)
        self.daemons = None if control is None else Daemons(state_dir, control, log)

    def daemon(self, device: Device) -> GpuDaemon | None:
        """For ``HostGpus.allocate``: the provider's daemon of a GPU with shares (``None``: none needed)."""
        daemons = self.daemons
        if daemons is None or not self.serves(device):
            return None
        return GpuDaemon(lambda: daemons.start(device), lambda: daemons.stop(device))

    def serves(self, device: Device) -> bool:
        """Whether the provider's own daemon serves ``device`` (installed, and the GPU named by its UUID)."""
        return self.daemons is not None and device.id.startswith("GPU-")

    def enforce(self, device: Device, memory: int | None, parts: int, *, command: bool) -> Enforcement:
        """How a share of ``parts`` (``memory`` bytes) of ``device`` is enforced; logged.

        :param command: the task runs a command (PyTorch's cap cannot reach it)
        :raises GpuUnavailableError: nothing enforces it, and the admin does not allow that
        """
        percent = max(1, -(-parts * 100 // SHARE_PARTS))
        size = f"{format_bytes(memory)} ({percent} %)" if memory else f"{percent} %"
        where = f"{size} of GPU {device.id} ({device.name or 'model unknown'})"
        fraction = memory / device.memory_total if memory and device.memory_total else parts / SHARE_PARTS
        share = {"memory": memory, "fraction": round(fraction, 6), "percent": percent, "gpu": device.id}
        pipes = self.admin or (self.daemons.pipes(device) if self.daemons and self.serves(device) else None)
        if pipes is not None and memory:
            environment = {
                "CUDA_MPS_PIPE_DIRECTORY": str(pipes),
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory // _MIB}M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent),
            }
            whose = "the admin's" if self.admin is not None else "the provider's"
            line = f"a share of {where}, enforced by MPS ({whose} daemon): " + ", ".join(
                f"{k}={v}" for k, v in environment.items() if k != "CUDA_MPS_PIPE_DIRECTORY"
            )
            return self._said(Enforcement(MPS, environment, {**share, "enforcement": MPS, "line": line}))
        why = "in a container (MPS needs the host's IPC namespace)" if self.in_container else "no MPS on this host"
        return self._said(without_mps(where, share, why, command=command, allow_unenforced=self.allow_unenforced))

    def _said(self, enforcement: Enforcement) -> Enforcement:
        self.log.info("[gpu] %s", enforcement.share["line"])
        return enforcement


def without_mps(
    where: str, share: Mapping[str, Any], why: str, *, command: bool, allow_unenforced: bool
) -> Enforcement:
    """Where no MPS serves a share (every backend's one rule): PyTorch's cap, or nothing where the admin allows it.

    A function gets PyTorch's cap; a command is refused unless the admin allows unenforced shares. ``where`` and
    ``why`` make the log line, ``share`` the summary's (``runtime/share.py``).

    :raises GpuUnavailableError: a command, and the admin does not allow unenforced shares
    """
    if not command:
        line = f"a share of {where}, enforced by PyTorch's cap on its CUDA allocator ({why})"
        allowed = {"unenforced_allowed": allow_unenforced}
        return Enforcement(FRAMEWORK, {}, {**share, "enforcement": FRAMEWORK, "line": line, **allowed})
    if not allow_unenforced:
        raise GpuUnavailableError(
            f"A share of {where} cannot be enforced: {why}, and PyTorch's cap cannot reach a command. Run it where "
            "MPS is, give the task a whole GPU, or ask the admin for [gpu_policy] allow_unenforced_gpu_shares."
        )
    line = f"a share of {where}, NOT enforced ({why}; a command): [gpu_policy] allow_unenforced_gpu_shares"
    return Enforcement(NONE, {}, {**share, "enforcement": NONE, "line": line})


def shared(enforcer: ShareEnforcer, allocation: Allocation, request: TaskRequest) -> Enforcement | None:
    """How the share ``allocation`` holds is enforced (``None``: it holds none, as after a CPU fallback)."""
    if allocation.share is None:
        return None
    claim, device = allocation.share.claim, allocation.devices[0]
    return enforcer.enforce(device, claim.memory, claim.parts, command=request.envelope.mode == "command")
