"""The mpi transport: mpi4py under the collectives (transport.py)."""
