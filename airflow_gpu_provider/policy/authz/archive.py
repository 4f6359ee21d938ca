"""What an archive may hold when the engine unpacks it into a container with a writable host folder.

The engine unpacks ``PUT /containers/{id}/archive`` as root, keeping each member's owner and mode, into the
container's filesystem with its mounts: a setuid file or a device node written through a read-write bind mount lands
on the host as root's (measured: a ``04755`` root-owned file appeared in the host folder). Such an upload is allowed
only when the plugin sees the archive (the engine shows a plugin only ``application/json`` bodies under 1 MiB: the
provider labels its uploads so) and it holds what the container's own user could have written: regular files and
folders, permission bits only and none world-writable, owned by the worker's uid and gid. The archive is read
strictly, uncompressed, with no extended headers, so the engine's Go reader cannot see another archive.
"""

from __future__ import annotations

import io
import os
import tarfile

from airflow_gpu_provider.policy.paths import UnsafePathError, components

#: The member types that hold only data: regular files (both spellings) and folders.
DATA_TYPES = frozenset({tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE})


def check_archive(data: bytes) -> None:
    """Refuse an upload unless it holds regular files and folders of the worker's own, permission bits only.

    :raises UnsafePathError: naming the member and what it would become on the host
    """
    owner = (os.geteuid(), os.getegid())
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for member in archive:
                _check_member(member, owner)
    except tarfile.TarError as err:
        raise UnsafePathError("the uploaded archive", f"not a plain tar archive ({err})") from None


def _check_member(member: tarfile.TarInfo, owner: tuple[int, int]) -> None:
    where = f"the archive's member {member.name!r}"
    if member.pax_headers:
        raise UnsafePathError(where, "extended (pax) headers are refused: the engine might read them otherwise")
    if member.type not in DATA_TYPES:
        raise UnsafePathError(where, "a link, device, FIFO or sparse file: only regular files and folders")
    if member.mode & ~0o777:
        raise UnsafePathError(where, f"mode {member.mode:o}: setuid, setgid and sticky bits are refused")
    if member.mode & 0o002:  # on the host, any local user could change what the task reads
        raise UnsafePathError(where, f"mode {member.mode:o}: world-writable files and folders are refused")
    if (member.uid, member.gid) != owner:
        raise UnsafePathError(where, f"owned by {member.uid}:{member.gid}, not the worker's {owner[0]}:{owner[1]}")
    components("/" + member.name.lstrip("/"))  # no '.' or '..' (the engine refuses a breakout too)
