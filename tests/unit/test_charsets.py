"""Which character sets hold which (ingest/model/charsets.py): a conversion keeps every value exactly when the new
set's repertoire holds the old one's; unknown pairs are taken as not holding."""

from __future__ import annotations

import itertools

import pytest

from ingest.model.charsets import BMP, LEGACY, UNICODE, holds, max_bytes, min_bytes, same_bytes

EVERY = sorted(UNICODE | BMP | LEGACY)


@pytest.mark.parametrize("old", EVERY)
def test_every_set_holds_itself_and_the_unicode_sets_hold_every_set(old: str) -> None:
    assert holds(old, old) and holds(old.upper(), old)
    assert all(holds(old, new) for new in UNICODE)


def test_the_bmp_sets_hold_every_set_but_the_full_unicode_ones() -> None:
    for old, new in itertools.product(EVERY, BMP):
        assert holds(old, new) == (old not in UNICODE), (old, new)


def test_a_legacy_set_holds_only_itself_and_ascii_but_swe7_holds_only_itself() -> None:
    for old, new in itertools.product(EVERY, LEGACY):
        assert holds(old, new) == (old == new or (old == "ascii" and new != "swe7")), (old, new)


def test_unknown_and_binary_sets_are_held_only_by_the_same() -> None:
    assert holds(None, None) and not holds("latin1", None) and not holds(None, "utf8mb4")
    assert not holds("some_new_set", "latin1") and holds("some_new_set", "some_new_set")


def test_bytes_per_character() -> None:
    assert (min_bytes("utf8mb4"), max_bytes("utf8mb4")) == (1, 4)
    assert (min_bytes("UCS2"), max_bytes("ucs2")) == (2, 2)
    assert (min_bytes("latin1"), max_bytes("latin1")) == (1, 1)
    assert (min_bytes(None), max_bytes(None)) == (1, 1)
    assert same_bytes("utf8mb3", "utf8mb4") and same_bytes("utf8mb4", "utf8") and same_bytes("ascii", "latin1")
    assert not same_bytes("latin1", "utf8mb4") and not same_bytes("ascii", "ucs2") and not same_bytes("ascii", "swe7")
