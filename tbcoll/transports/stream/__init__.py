"""The stream engine: point-to-point messages over one byte stream per pair of ranks, shared
by the byte-stream transports (tcp, rdma, and shm's point-to-point), which are no one
transport's privates.

Its parts, one module each:
- framing: the wire (header, descriptor, the engine's own contexts), as C describes it too;
- peers: what the engine holds per peer (its Channel, queues, requests, staging buffer);
- engine: StreamTransport, which matches messages to receives, moves bytes and waits;
- pulls: the pull protocol, where a transport can copy from another rank's memory;
- revocation: the notices that revoke a communicator on every rank;
- endpoint: StreamEndpoint, a communicator's door into the engine;
- turns: how several threads share one engine; words: the engine's state as C tests it.
"""

from tbcoll.core.framing import (
    CONTEXTS,
    DESCRIPTOR_FIELDS,
    HEADER,
    HEADER_FIELDS,
    PULL_IDS,
    bytes_of,
)
from tbcoll.transports.stream.endpoint import StreamEndpoint
from tbcoll.transports.stream.engine import StreamTransport
from tbcoll.transports.stream.peers import Channel, Peer, Recv, Send

__all__ = ["CONTEXTS", "DESCRIPTOR_FIELDS", "HEADER", "HEADER_FIELDS", "PULL_IDS", "Channel",
           "Peer", "Recv", "Send", "StreamEndpoint", "StreamTransport", "bytes_of"]
