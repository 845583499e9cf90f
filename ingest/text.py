"""How the job words counts in what a person reads (its log, `status`, `verify`)."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """`1 chunk`, `3 chunks`, `0 chunks`."""
    return f"{n} {noun if n == 1 else noun + 's'}"
