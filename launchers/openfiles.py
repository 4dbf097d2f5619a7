"""The soft limit of open files, raised to the hard one for tbrun and its ranks, as mpirun
does: tbrun holds ~4 descriptors a local rank (its output pipes, its input, its store
connection), and macOS's default soft limit, 256, would cap a job near 60 local ranks."""

from __future__ import annotations

import resource

# macOS refuses a soft limit above kern.maxfilesperproc (EINVAL), which its hard limit
# (RLIM_INFINITY) does not tell: OPEN_MAX, <sys/syslimits.h>, is the value it always takes
_OPEN_MAX = 10240


def raise_open_files() -> int:
    """Raise this process's soft limit of open files as far as the system lets it (children
    inherit it); return the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for wanted in (hard, min(hard, _OPEN_MAX)):
        if soft != resource.RLIM_INFINITY and (wanted == resource.RLIM_INFINITY or
                                               wanted > soft):
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
                return wanted
            except (ValueError, OSError):
                continue
    return soft
