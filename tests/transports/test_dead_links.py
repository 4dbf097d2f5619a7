"""A pulled cable with data in flight: what each OS's kernel tells of the connection
(tbcoll.transports.socket_mesh.unanswered), read from getsockopt answers made here, since
neither a Mac nor a cable can be had in CI. The macOS lane runs these too."""

import ctypes
import socket
import sys

import pytest

from tbcoll.core.errors import LINK_DOWN
from tbcoll.transports import socket_mesh


class TcpConnectionInfo(ctypes.Structure):
    """struct tcp_connection_info as XNU's bsd/netinet/tcp.h declares it, transcribed apart
    from socket_mesh.py's struct format, so that the two are checked against each other."""

    _fields_ = [(name, ctypes.c_uint8) for name in
                ("tcpi_state", "tcpi_snd_wscale", "tcpi_rcv_wscale", "pad1")] + [
        (name, ctypes.c_uint32) for name in
        ("tcpi_options", "tcpi_flags", "tcpi_rto", "tcpi_maxseg", "tcpi_snd_ssthresh",
         "tcpi_snd_cwnd", "tcpi_snd_wnd", "tcpi_snd_sbbytes", "tcpi_rcv_wnd", "tcpi_rttcur",
         "tcpi_srtt", "tcpi_rttvar")] + [("tfo_bits", ctypes.c_uint32, 15),
                                          ("pad2", ctypes.c_uint32, 17)] + [
        (name, ctypes.c_uint64) for name in
        ("tcpi_txpackets", "tcpi_txbytes", "tcpi_txretransmitbytes", "tcpi_rxpackets",
         "tcpi_rxbytes", "tcpi_rxoutoforderbytes", "tcpi_txretransmitpackets")]


class MacSocket:
    """Answers getsockopt(IPPROTO_TCP, TCP_CONNECTION_INFO) as a Mac would, from `info`."""

    def __init__(self) -> None:
        self.info = TcpConnectionInfo(tcpi_state=4, tcpi_rto=230, tcpi_srtt=2)

    def set(self, in_buffer: int, received: int, retransmitted: int) -> None:
        self.info.tcpi_snd_sbbytes = in_buffer
        self.info.tcpi_rxpackets = received
        self.info.tcpi_txretransmitpackets = retransmitted

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        assert (level, option) == (socket.IPPROTO_TCP, 0x106)
        return bytes(self.info)[:size]


@pytest.fixture
def on_a_mac(monkeypatch):
    """unanswered as it runs on macOS."""
    monkeypatch.setattr(socket_mesh, "_LINK_READERS", {sys.platform: socket_mesh._unanswered_macos})


def test_the_layout_is_xnus():
    assert socket_mesh._TCP_CONNECTION_INFO.size == ctypes.sizeof(TcpConnectionInfo) == 112
    info = TcpConnectionInfo(tcpi_snd_sbbytes=11, tcpi_rxpackets=22,
                             tcpi_txretransmitpackets=33)
    fields = socket_mesh._TCP_CONNECTION_INFO.unpack(bytes(info))
    assert (fields[socket_mesh._SND_SBBYTES], fields[socket_mesh._RXPACKETS],
            fields[socket_mesh._TXRETRANSMITPACKETS]) == (11, 22, 33)


def test_three_retransmissions_with_nothing_received_mean_no_link(on_a_mac):
    sock = MacSocket()
    for retransmitted in (4, 5, 6):  # counted from the first look: 4 came before it
        sock.set(in_buffer=65536, received=100, retransmitted=retransmitted)
        assert socket_mesh.unanswered(sock) is None
    sock.set(in_buffer=65536, received=100, retransmitted=7)
    assert socket_mesh.unanswered(sock) == f"3 retransmissions unanswered: {LINK_DOWN}"


def test_a_packet_from_the_peer_starts_the_count_again(on_a_mac):
    """A live peer's kernel answers (an acknowledgement, a window probe's answer), even while
    its process reads slowly: such a connection is never called dead."""
    sock = MacSocket()
    for received, retransmitted in ((100, 0), (100, 2), (101, 3), (101, 5), (102, 6)):
        sock.set(in_buffer=65536, received=received, retransmitted=retransmitted)
        assert socket_mesh.unanswered(sock) is None, (received, retransmitted)


def test_nothing_to_deliver_is_no_sign(on_a_mac):
    sock = MacSocket()
    sock.set(in_buffer=0, received=100, retransmitted=0)
    assert socket_mesh.unanswered(sock) is None
    sock.set(in_buffer=0, received=100, retransmitted=9)
    assert socket_mesh.unanswered(sock) is None  # no count was started: the buffer was empty
    sock.set(in_buffer=100, received=100, retransmitted=9)
    assert socket_mesh.unanswered(sock) is None


def test_a_kernel_that_answers_otherwise_is_no_sign(on_a_mac):
    class Refusing:
        def getsockopt(self, level, option, size):
            raise OSError(92, "Protocol not available")

    class Short(MacSocket):
        def getsockopt(self, level, option, size):
            return super().getsockopt(level, option, size)[:60]

    assert socket_mesh.unanswered(Refusing()) is None
    assert socket_mesh.unanswered(Short()) is None


def test_a_real_connection_here_is_alive():
    """This OS's own reader over a live loopback connection (none under the macOS lane,
    where TCP_INFO is taken away, and none on an OS without a reader)."""
    listener = socket.create_server(("127.0.0.1", 0))
    with listener, socket.create_connection(listener.getsockname()) as sock:
        accepted, _ = listener.accept()
        with accepted:
            sock.sendall(b"x" * 1000)
            assert socket_mesh.unanswered(sock) is None
