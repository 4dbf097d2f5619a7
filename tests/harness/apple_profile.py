"""The Apple profile (tests/harness/apple_profile.c): Apple's Thunderbolt RDMA driver's known
rules over rdma-core, as a verbs library the rdma backend opens through TBCOLL_RDMA_LIBRARY in
the RDMA lab; and its checker (tests/harness/apple_profile_check.c), which tries each rule on a
device. Both are built here with gcc against rdma-core's header (libibverbs-dev, which `make
rdma-lab` installs); the lab's guest sees the host's files, so it runs them where they were
built."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
# What MLX's jaccl resolves from librdma.dylib (mlx/distributed/jaccl/lib/jaccl/rdma.cpp): all
# Apple's library is known to have. The profile exports these and nothing else.
JACCL_SYMBOLS = ("ibv_get_device_list", "ibv_get_device_name", "ibv_open_device",
                 "ibv_free_device_list", "ibv_close_device", "ibv_alloc_pd", "ibv_create_qp",
                 "ibv_create_cq", "ibv_destroy_cq", "ibv_destroy_qp", "ibv_dealloc_pd",
                 "ibv_query_port", "ibv_query_gid", "ibv_modify_qp", "ibv_reg_mr",
                 "ibv_dereg_mr")
CFLAGS = ("-O2", "-Wall", "-Wextra", "-Werror")


def why_not_buildable() -> str | None:
    if shutil.which("gcc") is None:
        return "gcc is not installed"
    if not Path("/usr/include/infiniband/verbs.h").exists():
        return "infiniband/verbs.h is not installed (apt-get install libibverbs-dev)"
    return None


def build(folder: Path) -> tuple[Path, Path]:
    """(the profile, the checker), built into folder; CalledProcessError if gcc fails."""
    library, checker = folder / "libtbcoll_apple_profile.so", folder / "apple_profile_check"
    subprocess.run(["gcc", *CFLAGS, "-shared", "-fPIC", "-fvisibility=hidden", "-o", library,
                    HERE / "apple_profile.c", "-ldl", "-lpthread"], check=True,
                   capture_output=True, text=True)
    subprocess.run(["gcc", *CFLAGS, "-o", checker, HERE / "apple_profile_check.c", "-ldl"],
                   check=True, capture_output=True, text=True)
    return library, checker
