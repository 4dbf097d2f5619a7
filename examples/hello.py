"""Every rank says who it is and how long after the first rank it started.

    tbrun -np 4 examples/hello.py
"""

import socket
import time

import tbcoll

started = time.time()
info = tbcoll.launch_info()
if info is None:
    raise SystemExit("run me with tbrun, e.g.: tbrun -np 4 examples/hello.py")

with tbcoll.Store.from_launch(info) as store:
    store.set(f"hello/start/{info.rank}", repr(started))
    starts = [float(store.get(f"hello/start/{r}")) for r in range(info.size)]

first = min(starts)
print(f"hello from rank {info.rank} of {info.size} on {socket.gethostname()}, "
      f"started {1e3 * (started - first):.1f} ms after the first rank")
if info.rank == 0:
    print(f"start skew across {info.size} ranks: {1e3 * (max(starts) - first):.1f} ms")
