"""Run by every Python that starts with this folder on PYTHONPATH (the macOS lane puts it
first there for tbrun and its ranks): macOS's rules before anything else is imported."""

import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "_tbcoll_macos_rules", os.path.join(os.path.dirname(__file__), "..", "rules.py"))
_rules = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_rules)
_rules.apply(in_rank=True)
