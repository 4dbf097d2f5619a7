"""tcp connection set-up: every pair authenticated, and idle connections from anyone to a
rank's port cannot hold up its peers (they used to be served one at a time, 10 s each)."""

import socket
import threading
import time

from tbcoll import Store
from tbcoll.job.auth import new_token
from tbcoll.job.env import parse_hostport
from tbcoll.job.rendezvous import StoreServer
from tbcoll.transports.socket_mesh import connect_mesh


def test_idle_connections_to_a_rank_do_not_hold_up_its_peers():
    token = new_token()
    results, errors = {}, []
    with StoreServer(token) as server:
        def rank(r: int) -> None:
            try:
                with Store(*server.address, token) as store:
                    results[r] = connect_mesh(r, 3, ["127.0.0.1"], lambda peer: None, store,
                                              token, 20.0, "t")
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        first = threading.Thread(target=rank, args=(0,))
        first.start()
        with Store(*server.address, token) as store:
            address = parse_hostport(store.get("t/addr/0").decode(), "address")
        flood = [socket.create_connection(address, timeout=5) for _ in range(100)]
        start = time.monotonic()
        try:
            late = [threading.Thread(target=rank, args=(r,)) for r in (1, 2)]
            for thread in late:
                thread.start()
            for thread in (first, *late):
                thread.join(timeout=30)
        finally:
            for sock in flood:
                sock.close()
    assert not errors, errors
    assert time.monotonic() - start < 10
    assert sorted(results) == [0, 1, 2] and all(len(s) == 2 for s in results.values())
    for sockets in results.values():
        for sock in sockets.values():
            sock.close()
