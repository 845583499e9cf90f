"""Counts as a person reads them (ingest/text.py)."""

from __future__ import annotations

from ingest.text import counted


def test_one_is_singular_and_every_other_count_plural() -> None:
    assert [counted(n, "chunk") for n in (0, 1, 2)] == ["0 chunks", "1 chunk", "2 chunks"]
