"""The rendezvous store: protocol, blocking waits, atomic add, and the token handshake."""

import json
import os
import socket
import threading
import time

import pytest

from tbcoll import RendezvousError, Store
from tbcoll.job.auth import new_token
from tbcoll.job.rendezvous import StoreServer

from ..conftest import tagged_lines, tbrun


@pytest.fixture
def server():
    log = []
    token = new_token()
    with StoreServer(token, log=log.append) as srv:
        srv.token, srv.log = token, log
        yield srv


def client(server, token=None, **kw):
    return Store(*server.address, token or server.token, **kw)


def test_set_get_delete_and_wait(server):
    with client(server) as a, client(server) as b:
        a.set("k", b"\x00binary\xff")
        assert b.get("k") == b"\x00binary\xff"
        a.set(b"empty", b"")
        b.wait(["k", "empty"])
        assert b.get("empty") == b""
        assert a.delete("k") and not a.delete("k")
        with pytest.raises(RendezvousError, match=r"timed out after 0.2 s .* 'k'"):
            b.get("k", timeout=0.2)


def test_get_blocks_until_another_client_sets(server):
    with client(server) as a, client(server) as b:
        setter = threading.Timer(0.2, a.set, ("late", "value"))
        setter.start()
        started = time.monotonic()
        assert b.get("late", timeout=10) == b"value"
        assert 0.1 < time.monotonic() - started < 5
        setter.join(10)  # a's reply must arrive before a is closed


def test_add_is_atomic_across_clients(server):
    def bump():
        with client(server) as c:
            for _ in range(200):
                c.add("counter")
    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    with client(server) as c:
        assert c.add("counter", 0) == 800
        assert c.add("counter", -800) == 0
        c.set("text", "abc")
        with pytest.raises(RendezvousError, match="does not hold an integer"):
            c.add("text")


def test_wrong_token_is_refused_and_logged(server):
    with pytest.raises(RendezvousError, match="refused"):
        client(server, token=new_token())
    assert any("refused a store connection" in line and "TBCOLL_TOKEN" in line
               for line in server.log)
    with client(server) as good:  # the server goes on serving
        good.set("after", "1")
        assert good.get("after") == b"1"


def test_unauthenticated_bytes_are_never_interpreted(server):
    with socket.create_connection(server.address, timeout=10) as raw:
        assert raw.recv(40).startswith(b"TBCOLL1\n")
        raw.sendall(b"\x01" + b"\xff" * 63)  # a would-be SET with a huge length
        assert raw.recv(10) == b""  # closed on us
    assert any("refused" in line for line in server.log)


def test_closing_the_server_ends_waiting_clients(server):
    c = client(server)
    threading.Timer(0.2, server.close).start()
    with pytest.raises(RendezvousError, match="lost the rendezvous store"):
        c.get("never", timeout=30)
    c.close()


def test_unreachable_store_is_reported():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    expected = f"cannot reach the rendezvous store at 127.0.0.1:{port}"
    with pytest.raises(RendezvousError, match=expected):
        Store("127.0.0.1", port, new_token(), connect_timeout=0.3)


def test_store_round_trip_across_ranks(script):
    path = script("""
        import json, tbcoll
        info = tbcoll.launch_info()
        with tbcoll.Store.from_launch(info) as store:
            store.set(f"addr/{info.rank}", f"rank-{info.rank}-address")
            peers = [store.get(f"addr/{r}").decode() for r in range(info.size)]
            arrived = store.add("arrived")
            store.wait([f"addr/{r}" for r in range(info.size)])
            print(json.dumps({"peers": peers, "arrived": arrived}))
    """)
    p = tbrun("-np", 4, path)
    assert p.returncode == 0, p.stderr
    results = {r: json.loads(lines[0]) for r, lines in tagged_lines(p.stdout).items()}
    assert sorted(results) == [0, 1, 2, 3]
    for result in results.values():
        assert result["peers"] == [f"rank-{r}-address" for r in range(4)]
    assert sorted(r["arrived"] for r in results.values()) == [1, 2, 3, 4]


def test_rank_with_a_wrong_token_is_refused_by_tbrun(script):
    path = script("""
        import os, tbcoll
        info = tbcoll.launch_info()
        try:
            tbcoll.Store(*info.store, "0" * 64)
        except tbcoll.RendezvousError as e:
            print("refused:", e)
    """)
    p = tbrun("-np", 1, path)
    assert p.returncode == 0, p.stderr
    assert "[0] refused: the rendezvous store" in p.stdout
    assert "tbrun: refused a store connection from 127.0.0.1" in p.stderr


def test_token_is_not_readable_by_other_users(script):
    path = script("""
        import os
        print(oct(os.stat(f"/proc/{os.getpid()}/environ").st_mode & 0o777))
    """)
    if not os.path.exists("/proc/self/environ"):
        pytest.skip("no /proc on this OS")
    p = tbrun("-np", 1, path)
    assert p.stdout.strip() == "[0] 0o400"


def test_a_flood_of_idle_connections_does_not_lock_clients_out(server):
    """Idle connections from anyone (they never prove the token) cannot fill the store:
    past 64 in their handshake the stale ones are dropped, or a newcomer is told to retry."""
    flood = []
    try:
        for _ in range(300):
            flood.append(socket.create_connection(server.address, timeout=10))
        time.sleep(2.1)  # the flood is now stale
        with client(server, connect_timeout=10) as good:
            good.set("through", "1")
            assert good.get("through") == b"1"
    finally:
        for sock in flood:
            sock.close()
    assert any("store: 64 connections have not proven the token" in line for line in server.log)


def test_store_survives_running_out_of_descriptors(script):
    """macOS allows a process 256 files: 500 idle connections to tbrun's store used to end
    its accept loop (EMFILE), and every rank then failed to reach it."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    flood, stop = [], threading.Event()

    def connect_many():
        while len(flood) < 500 and not stop.is_set():
            try:
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                time.sleep(0.01)

    def limit_files():
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    attacker = threading.Thread(target=connect_many)
    attacker.start()
    try:
        import subprocess

        from ..conftest import TBRUN
        p = subprocess.run([TBRUN, "-np", "2", "--backend", "tcp", "--store-port", str(port),
                            str(script("""
                                import numpy as np, tbcoll
                                with tbcoll.init() as comm:
                                    print(comm.all_reduce(np.ones(2))[0])
                            """))], capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL, preexec_fn=limit_files)
    finally:
        stop.set()
        attacker.join()
        for sock in flood:
            sock.close()
    assert p.returncode == 0, p.stderr
    assert tagged_lines(p.stdout) == {0: ["2.0"], 1: ["2.0"]}
    assert len(flood) > 256
    assert "tbrun: store:" in p.stderr  # the flood was seen and said so
