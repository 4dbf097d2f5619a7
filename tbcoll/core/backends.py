"""The backends by name: the one list of them. Each transport is the module whose
`open_world(info, prefix)` connects a job's ranks and returns (world Group, local rank, node
index); it is imported only when a job uses it (importing mpi4py starts MPI, and tbrun, which
reads this list, imports no transport at all). "auto" is shm on one host, else tcp."""

TRANSPORTS = {"shm": "tbcoll.transports.shm.transport", "tcp": "tbcoll.transports.tcp.transport",
              "mpi": "tbcoll.transports.mpi.transport", "mlx": "tbcoll.transports.mlx.transport",
              "rdma": "tbcoll.transports.rdma.transport"}
BACKENDS = ("auto", *TRANSPORTS)
