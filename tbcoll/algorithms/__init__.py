"""Collective algorithms written once over the P2P interface of tbcoll.transports.base.

Each family module (ring, mesh, rd) offers all_reduce, all_gather, reduce_scatter and
broadcast on 1-D contiguous numpy buffers; rd also offers barrier. Ranks are the
communicator's. No module here imports a transport.
"""

from tbcoll.algorithms import mesh, rd, ring

FAMILIES = {"ring": ring, "mesh": mesh, "rd": rd}
