"""The one exception hierarchy of tbcoll and tbrun."""


class TbcollError(Exception):
    """Base of every error tbcoll raises on purpose."""


class CommError(TbcollError):
    """A collective or point-to-point operation failed: a peer was lost or a wait timed out."""


class PeerError(CommError):
    """This rank fails because of other ranks (peers: their ranks in the world, where known).
    tbrun learns of it, so that it names the rank that failed first, not this one."""

    def __init__(self, message: str, peers: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.peers = tuple(peers)


class PeerLostError(PeerError):
    """A peer went away (its connection closed, its process died) during an operation."""


# in a PeerLostError's message where the link itself was found dead (a pulled cable), not the
# peer: tbrun then names the link, even from one end's report alone
LINK_DOWN = "the link is down"
# how every transport that can see it names a peer whose process has gone (whatever its exit
# status: a rank that returns, exits 0 or crashes before receiving is lost alike)
EXITED = "exited or crashed"
PEER_ENDED = f"it ended ({EXITED})"
# in a PeerLostError's message where a pair's every path failed though neither end is known
# to have ended: under --keep-going each end reports the other to tbrun, whose failure set
# decides which is failed (a split: docs/failures.md)
NO_PATH_LEFT = "no path left to fail over to"
# why a failover began where a connection ended or was reset: a cut, or the peer's end; a
# peer that exited is known only once no path answers (then the loss says so)
CONNECTION_ENDED = "the connection ended"


class RankFailedError(PeerError):
    """Peers of this communicator have failed: tbrun (under --keep-going) declared them failed
    (their process ended, or it killed them frozen), so no call on it can complete. peers: the
    world ranks of this communicator in tbrun's failed set. The survivors may go on:
    comm.agree, comm.shrink (docs/failures.md)."""


class CommRevokedError(CommError):
    """The communicator was revoked: a call of some rank was interrupted (a KeyboardInterrupt,
    or an exception raised by a signal handler) once its peers may have moved on, a rank
    called comm.revoke(), or a rank found peers failed (tbrun --keep-going), so the ranks'
    calls are out of step for good. Every later call on it raises this at once, on every
    rank; the message names the rank and why."""


_REVOKED, _OUT_OF_STEP = "the communicator is revoked: ", ", so its ranks' calls are out of step"


def revoked(notice: str) -> str:
    """A revoked communicator's error message, from its notice (which rank was interrupted in
    which call)."""
    return (f"{_REVOKED}{notice}{_OUT_OF_STEP} for good and every call on it raises; close it "
            "(calls on other communicators go on)")


def revocation_notice(message: str) -> str | None:
    """The notice inside a revoked() message (to pass on as it was), else None."""
    start = message.find(_REVOKED)
    end = message.find(_OUT_OF_STEP, start)
    return message[start + len(_REVOKED):end] if start >= 0 and end >= 0 else None


class PeerTimeoutError(PeerError):
    """Peers did not take part in an operation within TBCOLL_TIMEOUT (frozen, stuck, or
    cut off without the connection noticing)."""


class RendezvousError(TbcollError):
    """The rendezvous store could not be reached, refused us, or did not answer in time."""


class LaunchError(TbcollError):
    """tbrun cannot start the job as asked (bad flags, missing program, port in use)."""


class HostfileError(TbcollError):
    """A hostfile or host list is malformed; the message names the file and line."""


class AuthenticationError(TbcollError):
    """A peer did not prove that it knows the job's TBCOLL_TOKEN."""
