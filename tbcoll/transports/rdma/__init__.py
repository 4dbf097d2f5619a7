"""The rdma transport: verbs queue pairs (the C extension _verbs, its files by job in
fabric.h) under the stream engine (transport.py), and the device checks (devices.py)."""
