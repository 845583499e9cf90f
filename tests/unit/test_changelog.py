"""Unit tests of ingest/changes/changelog.py: row changes become +I, -U/+U, -D rows in binlog order."""

from __future__ import annotations

import random

import pytest

from ingest.changes.changelog import SourceChange, changelog_rows, sequence_text
from ingest.model.changes import ChangelogRow


def change(
    pos: int,
    row: int,
    before: tuple[object, ...] | None,
    after: tuple[object, ...] | None,
    file_number: int = 3,
    gtid: str | None = "0-1-7",
) -> SourceChange:
    return SourceChange(f"mysql-bin.{file_number:06d}", file_number, pos, row, before, after, gtid, 1700000000)


def test_insert_update_delete_become_one_or_two_rows() -> None:
    rows = changelog_rows(
        [
            change(100, 0, None, (1, "a")),
            change(200, 0, (1, "a"), (1, "b")),
            change(300, 0, (1, "b"), None),
        ]
    )
    assert [(r.op, r.image) for r in rows] == [
        ("+I", (1, "a")),
        ("-U", (1, "a")),
        ("+U", (1, "b")),
        ("-D", (1, "b")),
    ]
    assert rows[0] == ChangelogRow(
        "+I", sequence_text(3, 100, 0, 0), "mysql-bin.000003:100", "0-1-7", 1700000000, (1, "a")
    )


def test_a_primary_key_change_is_not_collapsed() -> None:
    rows = changelog_rows([change(100, 0, (1, "a"), (2, "a"))])
    assert [(r.op, r.image) for r in rows] == [("-U", (1, "a")), ("+U", (2, "a"))]
    assert rows[0].seq < rows[1].seq


def test_every_change_of_a_hot_key_is_kept_in_binlog_order_whatever_the_input_order() -> None:
    changes = [change(100 + i, 0, (1, i), (1, i + 1)) for i in range(50)]
    changes += [change(100, r, None, (10 + r, 0)) for r in range(1, 4)]  # more rows of one event
    changes.append(change(4, 0, (1, 50), None, file_number=4))  # a later file, smaller position
    shuffled = changes[:]
    random.Random(7).shuffle(shuffled)
    rows = changelog_rows(shuffled)
    assert rows == changelog_rows(changes)
    assert len(rows) == 50 * 2 + 3 + 1
    assert [r.seq for r in rows] == sorted(r.seq for r in rows)
    assert rows[-1].op == "-D" and rows[-1].position == "mysql-bin.000004:4"


def test_sequence_text_sorts_like_the_numbers_it_holds() -> None:
    keys = [
        (1, 5, 0, 0),
        (1, 5, 0, 1),
        (1, 5, 1, 0),
        (1, 40, 0, 0),
        (2, 4, 0, 0),
        (999999, 1, 0, 0),
        (1000000, 1, 0, 0),
    ]
    texts = [sequence_text(*k) for k in keys]
    assert texts == sorted(texts)
    assert sequence_text(3, 1234, 2, 1) == "0000000003-000000001234-0000000002-1"
    with pytest.raises(ValueError, match="does not fit"):
        sequence_text(3, 10**12, 0, 0)


def test_a_change_without_images_is_an_error() -> None:
    with pytest.raises(ValueError, match="neither a before nor an after image"):
        changelog_rows([change(100, 0, None, None)])
