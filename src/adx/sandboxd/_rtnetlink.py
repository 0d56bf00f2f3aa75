"""A sandbox's veth pair, made in process over rtnetlink (no ``ip``): the messages ``ip link add ... type veth
peer name eth0 netns PID``, ``ip addr add`` and ``ip link set ... up`` send, on one NETLINK_ROUTE socket.

The supervisor made them with one ``ip -batch`` (a fork+exec, 2-6 ms, more under load) after the record commit,
on every veth create's path; these are three round trips into the kernel of a few microseconds each. Only the
standard library: the supervisor runs in the spawner's process tree, which imports nothing else.
"""

from __future__ import annotations

import errno
import os
import socket
import struct

__all__ = ["create_veth"]

_RTM_NEWLINK, _RTM_NEWADDR = 16, 20
_NLMSG_ERROR = 2
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_EXCL, _NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
_IFLA_IFNAME, _IFLA_LINKINFO, _IFLA_NET_NS_PID = 3, 18, 19
_IFLA_INFO_KIND, _IFLA_INFO_DATA, _VETH_INFO_PEER = 1, 2, 1
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_IFF_UP = 0x1
_NLMSG = struct.Struct("=IHHII")  # struct nlmsghdr: len, type, flags, seq, pid
_IFINFO = struct.Struct("=BxHiII")  # struct ifinfomsg: family, (pad), type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # struct ifaddrmsg: family, prefixlen, flags, scope, index


def _attr(kind: int, data: bytes) -> bytes:
    """One rtattr, padded to 4 bytes (NLA_ALIGN)."""
    length = 4 + len(data)
    return struct.pack("=HH", length, kind) + data + b"\0" * (-length % 4)


def _name(name: str) -> bytes:
    raw = name.encode()
    if not raw or len(raw) > 15:  # IFNAMSIZ - 1
        raise ValueError(f"not an interface name: {name!r}")
    return raw + b"\0"


class _Route:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self.seq = 0

    def request(self, *messages: tuple[int, int, bytes]) -> None:
        """Send ``(type, extra flags, payload)`` messages in one datagram and wait for their acks; a refusal
        raises OSError with the kernel's errno. The kernel handles each message on its own (a refused one does
        not stop the next), as ``ip -batch`` sends them."""
        out, pending = b"", set()
        for kind, flags, payload in messages:
            self.seq += 1
            pending.add(self.seq)
            flags |= _NLM_F_REQUEST | _NLM_F_ACK
            out += _NLMSG.pack(_NLMSG.size + len(payload), kind, flags, self.seq, 0) + payload
        self.sock.send(out)
        while pending:
            data = self.sock.recv(65536)
            offset = 0
            while offset + _NLMSG.size <= len(data):
                length, kind, _, seq, _ = _NLMSG.unpack_from(data, offset)
                if kind == _NLMSG_ERROR and seq in pending:
                    pending.discard(seq)
                    (code,) = struct.unpack_from("=i", data, offset + _NLMSG.size)
                    if code < 0:
                        raise OSError(-code, os.strerror(-code))
                offset += max(length + (-length % 4), _NLMSG.size)

    def close(self) -> None:
        self.sock.close()


def create_veth(host_if: str, peer: str, netns_pid: int, host_ip: str, prefix: int) -> None:
    """The pair: ``host_if`` here with ``host_ip/prefix``, up; ``peer`` in the network namespace of process
    ``netns_pid`` (down: the sandbox's init configures it). OSError as the kernel refuses (EEXIST: the name is
    taken, ESRCH: no such process, ...)."""
    peer_info = _IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _attr(_IFLA_IFNAME, _name(peer))
    peer_info += _attr(_IFLA_NET_NS_PID, struct.pack("=I", netns_pid))
    linkinfo = _attr(_IFLA_INFO_KIND, b"veth") + _attr(_IFLA_INFO_DATA, _attr(_VETH_INFO_PEER, peer_info))
    create = _IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _attr(_IFLA_IFNAME, _name(host_if))
    create += _attr(_IFLA_LINKINFO, linkinfo)
    route = _Route()
    try:
        route.request((_RTM_NEWLINK, _NLM_F_CREATE | _NLM_F_EXCL, create))
        try:
            index = socket.if_nametoindex(host_if)
        except OSError as exc:  # made a moment ago: only a concurrent delete removes it
            raise OSError(errno.ENODEV, f"{host_if} vanished after its creation: {exc}") from exc
        addr = socket.inet_aton(host_ip)
        address = _IFADDR.pack(socket.AF_INET, prefix, 0, 0, index) + _attr(_IFA_LOCAL, addr)
        address += _attr(_IFA_ADDRESS, addr)
        up = _IFINFO.pack(socket.AF_UNSPEC, 0, index, _IFF_UP, _IFF_UP)
        route.request(
            (_RTM_NEWADDR, _NLM_F_CREATE | _NLM_F_EXCL, address),
            (_RTM_NEWLINK, 0, up),
        )
    finally:
        route.close()
