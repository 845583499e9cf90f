"""The job's own collector threshold: raised for processes that build many small objects, never lowered."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from ingest.runtime.python_gc import FIRST_GENERATION_THRESHOLD, raise_gc_threshold


@pytest.fixture
def thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_the_first_generation_threshold_is_raised_and_the_older_ratios_kept(thresholds: None) -> None:
    gc.set_threshold(700, 11, 12)
    raise_gc_threshold()
    assert gc.get_threshold() == (FIRST_GENERATION_THRESHOLD, 11, 12)
    assert gc.isenabled()


def test_a_higher_threshold_set_by_the_user_is_kept(thresholds: None) -> None:
    gc.set_threshold(FIRST_GENERATION_THRESHOLD * 4, 10, 10)
    raise_gc_threshold()
    assert gc.get_threshold() == (FIRST_GENERATION_THRESHOLD * 4, 10, 10)
