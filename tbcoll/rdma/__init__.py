"""The rdma transport's C extension (_verbs) and its set-up helpers."""
