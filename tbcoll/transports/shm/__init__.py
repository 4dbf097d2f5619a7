"""The shm transport: ranks of one host over shared memory. transport.py opens it; segments,
ordered flags, rings, rounds and the C lane (its files by layer: shm.h) are its parts."""
