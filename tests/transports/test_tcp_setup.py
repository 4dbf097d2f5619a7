"""tcp connection set-up: every pair authenticated, and idle connections from anyone to a
rank's port cannot hold up its peers (they used to be served one at a time, 10 s each)."""

import logging
import socket
import threading
import time

import pytest

from tbcoll import Store
from tbcoll.core.errors import CommError
from tbcoll.job.auth import new_token
from tbcoll.job.env import parse_hostport
from tbcoll.job.rendezvous import StoreServer
from tbcoll.job.topology import CABLE, MANAGEMENT, Path
from tbcoll.transports.socket_mesh import connect_mesh, describe_paths, path_in_use


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


def _mesh_of_two(route, timeout=20.0):
    """connect_mesh of ranks 0 and 1 in threads, rank 0 listening on 127.0.0.1, 127.0.0.2 and
    192.0.2.1 (TEST-NET: no interface has it), rank 1 reaching it by route; (sockets or
    error) by rank."""
    token = new_token()
    got = {}
    with StoreServer(token) as server:
        def rank(r: int) -> None:
            hosts = ["127.0.0.1", "127.0.0.2", "192.0.2.1"] if r == 0 else ["127.0.0.1"]
            try:
                with Store(*server.address, token) as store:
                    got[r] = connect_mesh(r, 2, hosts, route if r else lambda peer: None,
                                          store, token, timeout, "t")
            except Exception as e:  # noqa: BLE001 (the caller looks)
                got[r] = e

        threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    return got


def test_a_pair_connects_over_its_first_path_that_answers(caplog):
    """Cable 1's address is on no interface of rank 0's host (it cannot listen there): rank 1
    connects over cable 2, says so in one line, and describe_paths names the path in use."""
    try:
        socket.create_server(("127.0.0.2", 0)).close()
    except OSError:
        pytest.skip("127.0.0.2 is not a loopback address here")
    paths = (Path(CABLE, 1, None, "192.0.2.1"), Path(CABLE, 2, None, "127.0.0.2"),
             Path(MANAGEMENT, 0, None, "127.0.0.1"))
    with caplog.at_level(logging.WARNING, logger="tbcoll.tcp"):
        got = _mesh_of_two(lambda peer: paths)
    assert all(isinstance(got[r], dict) for r in (0, 1)), got
    sock = got[1][0]
    assert sock.getpeername()[0] == "127.0.0.2" and path_in_use(sock, paths) == paths[1]
    assert describe_paths(sock, paths) == ("over cable 2; other paths: cable 1 (192.0.2.1), "
                                           "management (127.0.0.1)")
    lines = [r.getMessage() for r in caplog.records]
    assert "rank 0 cannot listen on its cable address 192.0.2.1" in "\n".join(lines), lines
    assert ("rank 0 <-> rank 1: cable 192.0.2.1: rank 0 does not listen there; over 127.0.0.2 "
            "(cable 2)") in lines, lines
    for sockets in got.values():
        for s in sockets.values():
            s.close()


def test_a_pair_with_no_path_answering_fails_naming_every_path():
    paths = (Path(CABLE, 1, None, "192.0.2.1"), Path(CABLE, 2, None, "192.0.2.2"))
    got = _mesh_of_two(lambda peer: paths, timeout=1.0)
    assert isinstance(got[1], CommError) and str(got[1]) == (
        "rank 1 could not connect to rank 0 over any of its 2 paths: cable 192.0.2.1: rank 0 "
        "does not listen there; cable 2 192.0.2.2: rank 0 does not listen there"), got
    assert isinstance(got[0], CommError) and "did not connect to rank 0" in str(got[0])
