"""The mlx transport's watchdog: MLX cannot interrupt a collective whose peer is gone (its
ring and jaccl backends wait for ever), so a thread looks at tbcoll's own connections beside
MLX and ends the rank within seconds, telling tbrun which peer it lost."""

import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("mlx.core")

from tbcoll.transports.socket_mesh import gone  # noqa: E402


def test_a_closed_or_reset_connection_is_seen_without_reading_it():
    here, there = socket.socketpair()
    here.setblocking(False)
    there.sendall(b"data")
    assert gone(here) is None  # data waiting: alive (and the data is left in place)
    assert here.recv(4) == b"data"
    there.close()
    assert gone(here) == "it ended (exited or crashed): it closed the connection"
    here.close()


def test_the_watchdog_ends_a_rank_stuck_in_mlx_once_a_peer_isgone():
    code = (
        "import time\n"
        "from tbcoll.transports.mlx.transport import Watchdog\n"
        "dog = Watchdog(0, 60.0, lambda: (1, 'it closed the connection'))\n"
        "dog._busy = ('all_reduce', time.monotonic())  # as inside mx.eval\n"
        "time.sleep(30)\n")
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert time.monotonic() - start < 10  # not the 60 s timeout
    assert ("tbcoll.PeerLostError: all_reduce on rank 0: lost rank 1 (it closed the "
            "connection)") in p.stderr


def test_a_dead_link_under_mlx_is_named_as_one_mlx_cannot_move_off():
    """Failover (docs/failover.md) moves tcp's streams, not MLX's: a rank stuck in MLX whose
    side connection's link died still ends, saying so."""
    code = (
        "import time\n"
        "from tbcoll.transports.mlx.transport import Watchdog\n"
        "dog = Watchdog(0, 60.0, lambda: (1, '3 retransmissions unanswered'))\n"
        "dog._busy = ('all_reduce', time.monotonic())  # as inside mx.eval\n"
        "time.sleep(30)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert ("lost rank 1 (3 retransmissions unanswered); MLX's collectives cannot move to "
            "another path") in p.stderr
