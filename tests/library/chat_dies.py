"""examples/chat.py with ranks that kill themselves: a test's wrapper, not an option of the
example. Run by tbrun in the place of chat.py, with chat.py's arguments.

CHAT_DIES="RANK:TOKEN:CALL,...": world rank RANK kills itself (SIGKILL) at the CALL-th
all_reduce of its forward pass for the TOKEN-th token of the first answer (1: the prompt's;
30 layers, so CALL 1-60), counted by the chat's own communicator wrapper (TimedComm).
"""

import importlib.util
import os
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DIES = {int(rank): (int(token), int(call)) for rank, token, call in
        (entry.split(":") for entry in os.environ["CHAT_DIES"].split(","))}
WHEN = DIES.get(int(os.environ["TBCOLL_RANK"]))

spec = importlib.util.spec_from_file_location("chat", REPO / "examples" / "chat.py")
chat = importlib.util.module_from_spec(spec)
spec.loader.exec_module(chat)

made = calls = 0  # tokens made, and all_reduce calls since the last one
add, all_reduce = chat.Answer.add, chat.TimedComm.all_reduce


def counted_add(self, token):
    global made, calls
    made, calls = made + 1, 0
    add(self, token)


def counted_all_reduce(self, x, **kwargs):
    global calls
    calls += 1
    if (made + 1, calls) == WHEN:
        os.kill(os.getpid(), signal.SIGKILL)
    return all_reduce(self, x, **kwargs)


if WHEN:
    chat.Answer.add, chat.TimedComm.all_reduce = counted_add, counted_all_reduce
sys.exit(chat.main(sys.argv[1:]))
