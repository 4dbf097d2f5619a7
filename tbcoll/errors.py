"""The one exception hierarchy of tbcoll and tbrun."""


class TbcollError(Exception):
    """Base of every error tbcoll raises on purpose."""


class CommError(TbcollError):
    """A collective or point-to-point operation failed: a peer was lost or a wait timed out."""


class PeerLostError(CommError):
    """A peer went away (its connection closed, its process died) during an operation: this
    rank fails because of another's failure. tbrun learns of it, so that it reports the
    rank that failed first, not this one."""


class RendezvousError(TbcollError):
    """The rendezvous store could not be reached, refused us, or did not answer in time."""


class LaunchError(TbcollError):
    """tbrun cannot start the job as asked (bad flags, missing program, port in use)."""


class HostfileError(TbcollError):
    """A hostfile or host list is malformed; the message names the file and line."""


class AuthenticationError(TbcollError):
    """A peer did not prove that it knows the job's TBCOLL_TOKEN."""
