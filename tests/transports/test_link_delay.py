"""TBCOLL_LINK_DELAY_US: the tcp transport's emulated link latency (benchmarks/tp_latency.py)."""

from ..conftest import tagged_lines, tbrun

PING_PONG = """
import time
import numpy as np
import tbcoll

comm = tbcoll.init()
x = np.arange(3.0) + comm.rank
comm.barrier()
started = time.perf_counter()
for _ in range(10):
    if comm.rank == 0:
        comm.send(x, 1)
        comm.recv(x, 1)
    else:
        comm.recv(x, 0)
        x += 1
        comm.send(x, 0)
one_way = (time.perf_counter() - started) / 20
total = comm.all_reduce(x)
print(f"{one_way * 1e6:.0f} {total.tolist()}")
if comm.rank == 1:
    comm.send(np.full(4, 7.0), 0)  # the last thing it does: held when it exits
else:
    print(comm.recv(np.empty(4), 1).tolist())
"""


def test_every_message_takes_the_delay_and_arrives(script):
    path = script(PING_PONG)
    p = tbrun("-np", 2, "--backend", "tcp", "-x", "TBCOLL_LINK_DELAY_US=3000", path)
    assert p.returncode == 0, p.stderr
    lines = tagged_lines(p.stdout)
    one_way = int(lines[0][0].split()[0])
    assert 3000 <= one_way < 30000, p.stdout
    assert lines[0][0].split(" ", 1)[1] == "[20.0, 22.0, 24.0]"  # each pong added 1
    assert lines[0][1] == "[7.0, 7.0, 7.0, 7.0]", p.stdout


def test_without_it_no_message_waits(script):
    path = script(PING_PONG)
    p = tbrun("-np", 2, "--backend", "tcp", path)
    assert p.returncode == 0, p.stderr
    assert int(tagged_lines(p.stdout)[0][0].split()[0]) < 3000


def test_a_bad_delay_is_named(script):
    path = script("import tbcoll\ntbcoll.init()\n")
    p = tbrun("-np", 2, "--backend", "tcp", "-x", "TBCOLL_LINK_DELAY_US=soon", path)
    assert p.returncode != 0
    assert "TBCOLL_LINK_DELAY_US='soon': give a number of microseconds >= 0" in p.stderr


MANY_SMALL = """
import numpy as np
import tbcoll

comm = tbcoll.init()
x = np.arange(6.0).reshape(2, 3) + comm.rank  # a 2-D array, as tensor-parallel layers pass
for _ in range(200):  # messages due while others are readable: the wait's two kinds at once
    total = comm.all_reduce(x)
print(total.tolist())
"""


def test_held_and_ready_messages_at_once_and_2d_arrays(script):
    """A wait that found messages due and sockets ready at once raised ValueError, and a 2-D
    array's bytes were counted by rows (issue 36's decode at 100-150 us)."""
    for delay in (150, 400):
        p = tbrun("-np", 2, "--backend", "tcp", "-x", f"TBCOLL_LINK_DELAY_US={delay}",
                  script(MANY_SMALL), timeout=120)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        assert tagged_lines(p.stdout)[0] == ["[[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]]"], p.stdout
