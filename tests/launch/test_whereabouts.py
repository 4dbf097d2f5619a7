"""Where each rank was, from dumps made up here (no processes): tbcoll.launch.whereabouts."""

from tbcoll.launch.whereabouts import where

WORLD = [0, 1, 2, 3]


def dump(current=None, completed=50, site="train.py:20", ranks=WORLD, more=()):
    comms = [{"ranks": ranks, "completed": completed, "current": current}, *more]
    return {"communicators": comms, "clock": {"perf": 100.0},
            "stacks": [{"thread": "MainThread", "main": True, "site": site}]}


def call(collective, seq=51, dtype="float32", nbytes=4096, site="train.py:14", **more):
    return {"collective": collective, "seq": seq, "dtype": dtype, "bytes": nbytes,
            "site": site, "op": "sum", "root": None, "state": "running", **more}


def test_a_rank_that_left_the_common_path_is_named_with_both_lines():
    dumps = {r: dump(call("all_reduce", start=70.0)) for r in (0, 1, 3)}
    dumps[2] = dump(call("barrier", dtype=None, nbytes=0, site="train.py:12"))
    lines = where(dumps)
    assert lines[0] == "  ranks 0, 1, 3: all_reduce #51 float32 4096 B at train.py:14 (for 30.0 s)"
    assert lines[1] == "  rank 2: barrier #51 at train.py:12"
    assert lines[-1] == "  -- rank 2 left the common path (the others are in all_reduce #51)"


def test_a_rank_outside_the_call_the_others_wait_in():
    dumps = {r: dump(call("all_reduce")) for r in (0, 1, 2)}
    dumps[3] = dump(None, completed=50, site="train.py:30")
    lines = where(dumps)
    assert "  rank 3: not in a call (50 made), at train.py:30" in lines
    assert lines[-1] == "  -- rank 3 did not enter all_reduce #51 (ranks 0, 1, 2 did)"


def test_silent_and_exited_ranks_are_told_apart():
    dumps = {0: dump(call("all_reduce")), 1: dump(call("all_reduce"))}
    lines = where(dumps, silent=[2])
    assert "  rank 2: did not answer (frozen, or holding Python's lock?)" in lines
    assert "  rank 3: no dump (exited before it was asked)" in lines


def test_an_even_split_names_no_culprit():
    dumps = {r: dump(call("all_reduce" if r < 2 else "all_gather")) for r in range(4)}
    assert where(dumps)[-1] == "  -- call #51 differs between ranks: ranks 0, 1; ranks 2, 3"


def test_no_rank_in_a_call_says_nothing():
    assert where({r: dump(None) for r in range(4)}) == []


def test_subcommunicators_get_a_heading_and_point_to_point_calls_their_peer():
    sub = {"ranks": [0, 2], "completed": 3, "current": None}
    dumps = {r: dump(None, more=[sub] if r in (0, 2) else []) for r in range(4)}
    dumps[0]["communicators"][1] = {**sub, "current": call("recv", seq=None, peer=1, tag=7)}
    dumps[2]["communicators"][1] = {**sub, "current": call("all_gather", seq=4)}
    lines = where(dumps)
    assert lines[0] == "the communicator of ranks 0, 2:"
    assert "  rank 0: recv from rank 1 tag 7 float32 4096 B at train.py:14" in lines
