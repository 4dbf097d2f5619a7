"""What this host's RDMA stack offers, read through the ibverbs API itself (ctypes): whether
the library loads, each device, each port's state, and its GIDs. The same calls serve Linux
(rdma-core's libibverbs.so.1) and macOS 26.2+ (librdma.dylib, as MLX's jaccl loads it), so
what tbrun doctor reports is what a transport opening the device would meet.

Only exported functions are called (ibv_post_send and friends are inline; none is needed here),
with a generous buffer for struct ibv_port_attr, whose first fields are fixed by the ABI:
state, max_mtu, active_mtu, gid_tbl_len (four 32-bit ints).
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import sys
from pathlib import Path

from tbcoll.job.env import rdma_library

LIBRARIES = {"darwin": ("librdma.dylib",), "linux": ("libibverbs.so.1",)}
PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
MTUS = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
MAX_PORTS = 8  # ports are numbered from 1; past the last one ibv_query_port fails
MAX_GIDS = 16  # the IPv4-mapped GID sits at index 1 (Macs) or among the first few (RoCE)


def _platform_key() -> str:
    return "darwin" if sys.platform == "darwin" else "linux"


def load() -> tuple[ctypes.CDLL | None, str]:
    """The verbs library and its name, or None and why it did not load: TBCOLL_RDMA_LIBRARY
    where set (what the rdma backend would open), else the platform's."""
    errors = []
    named = rdma_library()
    for name in (named,) if named else LIBRARIES[_platform_key()]:
        try:
            return ctypes.CDLL(name, use_errno=True), name
        except OSError as e:
            errors.append(str(e))
    return None, "; ".join(errors)


def _declare(lib: ctypes.CDLL) -> None:
    lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
    lib.ibv_get_device_list.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.ibv_free_device_list.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.ibv_get_device_name.restype = ctypes.c_char_p
    lib.ibv_get_device_name.argtypes = [ctypes.c_void_p]
    lib.ibv_open_device.restype = ctypes.c_void_p
    lib.ibv_open_device.argtypes = [ctypes.c_void_p]
    lib.ibv_close_device.argtypes = [ctypes.c_void_p]
    lib.ibv_query_port.argtypes = [ctypes.c_void_p, ctypes.c_uint8, ctypes.c_void_p]
    lib.ibv_query_gid.argtypes = [ctypes.c_void_p, ctypes.c_uint8, ctypes.c_int,
                                  ctypes.c_void_p]


def gid_text(raw: bytes) -> tuple[str, str | None]:
    """A GID as IPv6 text, and the IPv4 address it maps (::ffff:a.b.c.d), if it does."""
    address = ipaddress.IPv6Address(raw)
    mapped = address.ipv4_mapped
    if mapped:  # as ibv_devinfo and Python 3.13 write it (3.11 writes ::ffff:a63:1)
        return f"::ffff:{mapped}", str(mapped)
    return str(address), None


def _netdev(device: str, port: int) -> str | None:
    """The network interface under a RoCE port: sysfs on Linux; rdma_enX is enX on macOS."""
    if sys.platform == "darwin":
        return device[5:] if device.startswith("rdma_") else None
    ndevs = Path(f"/sys/class/infiniband/{device}/ports/{port}/gid_attrs/ndevs")
    for index in range(MAX_GIDS):
        try:
            name = (ndevs / str(index)).read_text().strip()
        except OSError:
            continue
        if name:
            return name
    return None


def _port(lib: ctypes.CDLL, context: int, device: str, port: int) -> dict | None:
    attr = ctypes.create_string_buffer(256)
    if lib.ibv_query_port(context, port, attr) != 0:
        return None
    state, _, active_mtu, gid_table = (int.from_bytes(attr.raw[k:k + 4], sys.byteorder)
                                       for k in (0, 4, 8, 12))
    gids = []
    gid = ctypes.create_string_buffer(16)
    for index in range(min(gid_table, MAX_GIDS)):
        if lib.ibv_query_gid(context, port, index, gid) != 0 or not any(gid.raw):
            continue
        text, ipv4 = gid_text(gid.raw)
        gids.append({"index": index, "gid": text, "ipv4": ipv4})
    return {"port": port, "state": PORT_STATES.get(state, str(state)),
            "active_mtu": MTUS.get(active_mtu), "gids": gids, "netdev": _netdev(device, port)}


def rdma_facts() -> dict:
    """{"library": name or None, "error": why not, "devices": [{"name", "ports": [...]}]}"""
    lib, name = load()
    if lib is None:
        return {"library": None, "error": name, "devices": []}
    try:
        _declare(lib)
    except AttributeError as e:  # a library without the verbs API
        return {"library": None, "error": f"{name}: {e}", "devices": []}
    count = ctypes.c_int(0)
    devices = lib.ibv_get_device_list(ctypes.byref(count))
    if not devices:  # e.g. ENOSYS: a kernel without RDMA support
        reason = os.strerror(ctypes.get_errno())
        return {"library": name, "error": f"ibv_get_device_list: {reason}", "devices": []}
    found = []
    try:
        for i in range(count.value):
            device = lib.ibv_get_device_name(devices[i]).decode()
            context = lib.ibv_open_device(devices[i])
            if not context:
                found.append({"name": device, "ports": [], "error": "cannot be opened"})
                continue
            try:
                ports = [p for p in (_port(lib, context, device, k)
                                     for k in range(1, MAX_PORTS + 1)) if p]
            finally:
                lib.ibv_close_device(context)
            found.append({"name": device, "ports": ports})
    finally:
        lib.ibv_free_device_list(devices)
    return {"library": name, "error": None, "devices": found}


if __name__ == "__main__":
    import json

    print(json.dumps(rdma_facts(), indent=1))
