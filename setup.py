"""Builds the one C extension, tbcoll.shm._atomics; everything else is in pyproject.toml.

optional=True: without a compiler the install still succeeds and tbcoll.shm uses its
pure-Python flags (slower, equally correct).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tbcoll.shm._atomics", ["tbcoll/shm/_atomics.c"], optional=True)])
