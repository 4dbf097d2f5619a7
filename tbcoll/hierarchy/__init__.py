"""Two levels: a job whose hosts each run several ranks moves data through shared memory
inside a host and over the network only between hosts (docs/hosts.md).

A two-level Group is made of a Group per level, each run by a Communicator of its own: the
host's shm group, and the network's groups of one rank per host (the leaders; on tcp also
each rail, rank k of every host). Its point-to-point routes each peer to the level that holds
it. It sits above tbcoll.comm because its collectives are calls of those communicators.
"""
