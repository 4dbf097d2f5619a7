"""One verdict of tbrun doctor: a line, and for a failure what to do."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    status: str  # ok, FAIL or skip
    what: str
    detail: str
    fix: str = ""

    def __str__(self) -> str:
        line = f"{self.status:<4}  {self.what}: {self.detail}"
        return f"{line}\n      fix: {self.fix}" if self.fix else line
