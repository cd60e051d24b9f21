"""What the local cluster takes from this machine: TCP ports, files only their owner reads, fake GPU devices.

Its daemons bind fixed ports, so a port another program holds, or one in the
kernel's range for outgoing connections (any connection may take it), makes a
daemon fail at start: `kernel_port_ranges` and `port_free` let `up` refuse early,
naming the port. munged and slurmdbd refuse a key or config others can read
(`write_private`); slurmd only stats its GPUs' device files (`make_gpus`).
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

from slurm_elastico.cluster import config


def kernel_port_ranges() -> tuple[tuple[int, int], list[tuple[int, int]]] | None:
    """The kernel's range for outgoing connections' ports and its reserved ports; None where unreadable."""
    base = Path("/proc/sys/net/ipv4")
    try:
        local = config.parse_port_ranges((base / "ip_local_port_range").read_text())[0]
    except (OSError, ValueError, IndexError):
        return None
    try:
        reserved = config.parse_port_ranges((base / "ip_local_reserved_ports").read_text())
    except (OSError, ValueError):  # a kernel without the list reserves nothing
        reserved = []
    return local, reserved


def port_free(port: int) -> bool:
    """Whether a listening socket could bind `port` on all addresses now (TIME_WAIT does not count)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def write_private(path: Path, content: str | bytes, mode: int = 0o600) -> None:
    """Create `path` readable by its owner only, with no moment of wider permissions."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(content.encode() if isinstance(content, str) else content)


def make_gpus(directory: Path, count: int) -> None:
    """Fake NVIDIA devices nvidia0..N-1 (char 195:N): slurmd only stats them; a plain file if mknod is refused."""
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        path = directory / f"nvidia{index}"
        if path.exists() or path.is_symlink():
            continue
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(config.NVIDIA_MAJOR, index))
        except PermissionError:
            path.touch()
