"""Shared-memory building blocks: segments (segment.py) and ordered flags (flags.py)."""
