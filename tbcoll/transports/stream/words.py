"""The stream engine's words (StreamTransport.words): what a transport's C path must know
before it moves a message to or from a peer by itself, each in one machine word that C tests
with one load.

words[ENGINE_WORD] holds the engine's bits: STALE where the state words may be out of date
(each door marks them so as it leaves, tbcoll.transports.stream.turns.Marking; C then has the engine
publish them, StreamTransport.publish_words) and WRITING (whether threads share the engine is
Turns.shared_word). Peer k's are
words[PEER_WORDS + k * WORDS_PER_PEER + STATE_WORD] (the peer bits below) and
[... + NEXT_PULL_WORD] (the id of the next message pulled from this rank by k, which the
engine and C both take), [... + SENT_WORD] and [... + RECEIVED_WORD] (every byte the stream to
k has carried each way, header and payload, whichever path moved it: the engine adds what its
Channel moves, a C path what it moves on the socket itself; kept across a new Channel,
StreamTransport.replace_channel, so that a stream can resume from the byte its peer last
received). Only the holder of the engine (its Turns) writes or reads the counts, so plain adds
suffice. tbcoll/include/engine_words.h has the same layout; each extension that includes it
exports it, and its transport checks it at import (check_words).
"""

from __future__ import annotations

from types import ModuleType

ENGINE_WORD, PEER_WORDS, WORDS_PER_PEER = 0, 1, 4
STATE_WORD, NEXT_PULL_WORD, SENT_WORD, RECEIVED_WORD = 0, 1, 2, 3
# the engine word's bits
STALE = 1 << 0  # the state words may be out of date
WRITING = 1 << 1  # a send waits for room in a socket (tcp: the engine must watch it)
# a peer's state word's bits
SENDING = 1 << 0  # a send to the peer is queued: what goes next to it is the engine's
LOST = 1 << 1  # the peer's stream is lost (or failing over: either way the engine's)
READING = 1 << 2  # a message from the peer is half-read, or its stage holds unread bytes
POSTED = 1 << 3  # a receive from the peer is posted (any context and tag)
UNEXPECTED = 1 << 4  # a message from the peer is held for its receive (any context and tag)
MISMATCH = 1 << 5  # the ranks' calls were found to differ (the engine's: in every peer's word)
PULLS = 1 << 6  # large messages to and from the peer are pulled
# a failover's tail (tbcoll.transports.stream.replay.Tail): its words, the ring's stream
# offsets [start, end) and the size in use of its ring (reserved once: C holds it); a message
# this large is held while written, not copied (C leaves it to the Tail)
TAIL_START, TAIL_END, TAIL_SIZE, TAIL_WORDS = 0, 1, 2, 3
TAIL_LARGE = 64 << 10
WORD_LAYOUT = {"ENGINE_WORD": ENGINE_WORD, "STALE": STALE, "WRITING": WRITING,
               "PEER_WORDS": PEER_WORDS, "WORDS_PER_PEER": WORDS_PER_PEER,
               "STATE_WORD": STATE_WORD, "NEXT_PULL_WORD": NEXT_PULL_WORD,
               "SENT_WORD": SENT_WORD, "RECEIVED_WORD": RECEIVED_WORD, "SENDING": SENDING,
               "LOST": LOST, "READING": READING, "POSTED": POSTED, "UNEXPECTED": UNEXPECTED,
               "MISMATCH": MISMATCH, "PULLS": PULLS, "TAIL_START": TAIL_START,
               "TAIL_END": TAIL_END, "TAIL_SIZE": TAIL_SIZE, "TAIL_WORDS": TAIL_WORDS,
               "TAIL_LARGE": TAIL_LARGE}


def check_words(module: ModuleType | None) -> None:
    """A C extension's words are laid out as here (a build of another version would test
    other bits, and move a message that must wait); None: not built."""
    if module is None:
        return
    differs = {name: (value, getattr(module, name, None)) for name, value in WORD_LAYOUT.items()
               if getattr(module, name, None) != value}
    if differs:
        raise ImportError(f"{module.__name__} was built from another version of "
                          f"tbcoll/include/engine_words.h (the engine's words {differs}, "
                          "tbcoll.transports.stream.words' first): reinstall tbcoll")
