"""The Communicator (communicator.py) and what it is made of: the routes of its latency-
critical calls, point-to-point, non-blocking requests, uneven all_gather, the ownership of a
communicator by one thread at a time and shared allocations."""
