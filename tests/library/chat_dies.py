"""examples/chat.py with ranks that die: a test's wrapper, not an option of the example.

CHAT_DIES="RANK:CALL,...": world rank RANK kills itself (SIGKILL) at its CALL-th all_reduce
(30 layers: 60 a forward pass; the prompt's are 1-60, the second token's 61-120, ...).
CHAT_STANDIN=1: instead, every rank raises RankFailedError at that call, and the
communicator's shrink is a split that leaves RANK out (it then exits 0): the recovery without
the library's revoke and shrink.
"""

import importlib.util
import os
import signal
import sys
from pathlib import Path

import tbcoll

REPO = Path(__file__).resolve().parents[2]
DIES = {int(rank): int(call) for rank, call in
        (pair.split(":") for pair in os.environ["CHAT_DIES"].split(","))}
STANDIN = os.environ.get("CHAT_STANDIN") == "1"
WORLD_RANK = int(os.environ["TBCOLL_RANK"])

spec = importlib.util.spec_from_file_location("chat", REPO / "examples" / "chat.py")
chat = importlib.util.module_from_spec(spec)
spec.loader.exec_module(chat)


class StandIn:
    """A communicator whose revoke, agree and shrink are stood in for with split."""

    def __init__(self, comm):
        self.inner = comm

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.inner.close()

    def revoke(self):
        pass

    def agree(self, flag):
        self.inner.barrier()
        return flag

    def shrink(self):
        dying = DIES.get(WORLD_RANK, 1 << 62) <= calls
        sub = self.inner.split(None if dying else 0)
        if sub is None:
            os._exit(0)
        return StandIn(sub)


calls = 0
all_reduce = chat.TimedComm.all_reduce


def counted(self, x, **kwargs):
    global calls
    calls += 1
    if STANDIN and calls in DIES.values():
        raise tbcoll.RankFailedError("stand-in", peers=())
    if not STANDIN and DIES.get(WORLD_RANK) == calls:
        os.kill(os.getpid(), signal.SIGKILL)
    return all_reduce(self, x, **kwargs)


chat.TimedComm.all_reduce = counted
if STANDIN:
    init = tbcoll.init
    chat.tbcoll.init = lambda *a, **k: StandIn(init(*a, **k))
    os.environ["TBCOLL_KEEP_GOING"] = "1"
sys.exit(chat.main(sys.argv[1:]))
