"""A sandbox's network interfaces, set up from inside its network namespace (ioctls, no ip(8))."""

from __future__ import annotations

import fcntl
import socket
import struct

__all__ = ["add_default_route", "configure_interface", "set_loopback_up"]

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def _bring_up(sock: socket.socket, name: str) -> None:
    ifreq = struct.pack("16sH14s", name.encode(), 0, b"")
    flags = struct.unpack("16sH14s", fcntl.ioctl(sock, _SIOCGIFFLAGS, ifreq))[1]
    fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14s", name.encode(), flags | _IFF_UP, b""))


def set_loopback_up() -> None:
    """Bring ``lo`` up in a fresh network namespace (SIOCGIFFLAGS/SIOCSIFFLAGS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        _bring_up(sock, "lo")


def configure_interface(name: str, address: str, prefix: int) -> None:
    """Give ``name`` an IPv4 address/prefix and bring it up (SIOCSIFADDR, SIOCSIFNETMASK, SIOCSIFFLAGS)."""
    mask = (0xFFFFFFFF << (32 - prefix)) & 0xFFFFFFFF
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for request, raw in ((0x8916, socket.inet_aton(address)), (0x891C, struct.pack("!I", mask))):
            ifreq = struct.pack("16sH2s4s8s", name.encode(), socket.AF_INET, b"", raw, b"")
            fcntl.ioctl(sock, request, ifreq)
        _bring_up(sock, name)


def add_default_route(gateway: str) -> None:
    """Route everything through ``gateway`` (SIOCADDRT with RTF_UP|RTF_GATEWAY): the veth's host end, which
    forwards (and NATs) what the node's egress policy lets through."""

    def sockaddr(addr: bytes) -> bytes:
        return struct.pack("=HH4s8s", socket.AF_INET, 0, addr, b"")

    zero = socket.inet_aton("0.0.0.0")
    # struct rtentry, native layout: pad1, dst, gateway, genmask, flags, pad2, pad3, pad4, metric, dev, mtu,
    # window, irtt.
    rtentry = struct.pack(
        "@L16s16s16sHhLPhPLLH",
        0,
        sockaddr(zero),
        sockaddr(socket.inet_aton(gateway)),
        sockaddr(zero),
        0x1 | 0x2,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fcntl.ioctl(sock, 0x890B, rtentry)
