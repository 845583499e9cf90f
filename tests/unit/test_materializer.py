"""Unit tests of ingest.changes.materializer: ordering by sequence, one final state per key, key changes."""

from __future__ import annotations

import gc
import random
import weakref
from collections.abc import Iterator

from ingest.changes.materializer import Change, Key, Row, created_keys, materialize

PK = (0,)


def seq(pos: int, row: int = 0, file: int = 1) -> tuple[int, int, int]:
    return (file, pos, row)


def insert(s: tuple[int, int, int], after: Row) -> Change:
    return Change(s, None, after)


def update(s: tuple[int, int, int], before: Row, after: Row) -> Change:
    return Change(s, before, after)


def delete(s: tuple[int, int, int], before: Row) -> Change:
    return Change(s, before, None)


def apply(table: dict[Key, Row], result: dict[Key, Row | None]) -> dict[Key, Row]:
    """What MERGE INTO does with a materialized batch: upsert the rows, delete the keys mapped to None."""
    out = dict(table)
    for key, row in result.items():
        if row is None:
            out.pop(key, None)
        else:
            out[key] = row
    return out


# --------------------------------------------------------------------------------------------------
# op
# --------------------------------------------------------------------------------------------------


def test_op_names_insert_update_and_delete() -> None:
    assert insert(seq(1), (1, "a")).op == "+I"
    assert update(seq(2), (1, "a"), (1, "b")).op == "+U"
    assert update(seq(3), (1, "b"), (2, "b")).op == "+U"  # a key change is still one update
    assert delete(seq(4), (2, "b")).op == "-D"


# --------------------------------------------------------------------------------------------------
# One key, several changes in one batch
# --------------------------------------------------------------------------------------------------


def test_empty_batch_materializes_to_nothing() -> None:
    assert materialize([], PK) == {}


def test_insert_update_update_keeps_the_last_image() -> None:
    changes = [
        insert(seq(10), (1, "v1", 100)),
        update(seq(20), (1, "v1", 100), (1, "v2", 200)),
        update(seq(30), (1, "v2", 200), (1, "v3", 300)),
    ]
    assert materialize(changes, PK) == {(1,): (1, "v3", 300)}
    assert materialize(reversed(changes), PK) == {(1,): (1, "v3", 300)}


def test_update_of_a_row_from_before_the_batch_is_an_upsert() -> None:
    assert materialize([update(seq(5), (9, "old"), (9, "new"))], PK) == {(9,): (9, "new")}


def test_delete_of_a_row_from_before_the_batch_is_a_delete() -> None:
    assert materialize([delete(seq(5), (9, "old"))], PK) == {(9,): None}


def test_insert_then_delete_in_one_batch_is_a_delete() -> None:
    changes = [insert(seq(10), (1, "a")), update(seq(11), (1, "a"), (1, "b")), delete(seq(12), (1, "b"))]
    assert materialize(changes, PK) == {(1,): None}
    assert materialize(changes[::-1], PK) == {(1,): None}


def test_delete_then_reinsert_of_the_same_key_is_the_new_row() -> None:
    changes = [delete(seq(10), (1, "old")), insert(seq(11), (1, "new"))]
    assert materialize(changes, PK) == {(1,): (1, "new")}
    assert materialize(changes[::-1], PK) == {(1,): (1, "new")}


def test_unrelated_keys_are_independent() -> None:
    changes = [insert(seq(1), (1, "a")), insert(seq(2), (2, "b")), delete(seq(3), (3, "c"))]
    assert materialize(changes, PK) == {(1,): (1, "a"), (2,): (2, "b"), (3,): None}


# --------------------------------------------------------------------------------------------------
# Primary-key updates
# --------------------------------------------------------------------------------------------------


def test_key_update_deletes_the_old_key_and_upserts_the_new_one() -> None:
    assert materialize([update(seq(10), (1, "x"), (2, "x"))], PK) == {(1,): None, (2,): (2, "x")}


def test_key_update_chain_a_b_c() -> None:
    changes = [
        insert(seq(10), (1, "x")),
        update(seq(20), (1, "x"), (2, "x")),
        update(seq(30), (2, "x"), (3, "y")),
    ]
    expected = {(1,): None, (2,): None, (3,): (3, "y")}
    assert materialize(changes, PK) == expected
    for order in ([2, 1, 0], [1, 0, 2], [2, 0, 1]):
        assert materialize([changes[i] for i in order], PK) == expected


def test_key_swap_through_a_temporary_key() -> None:
    # UPDATE t SET id=99 WHERE id=1; UPDATE t SET id=1 WHERE id=2; UPDATE t SET id=2 WHERE id=99
    changes = [
        update(seq(10), (1, "row-a"), (99, "row-a")),
        update(seq(20), (2, "row-b"), (1, "row-b")),
        update(seq(30), (99, "row-a"), (2, "row-a")),
    ]
    expected = {(1,): (1, "row-b"), (2,): (2, "row-a"), (99,): None}
    assert materialize(changes, PK) == expected
    for order in ([2, 1, 0], [1, 2, 0], [0, 2, 1], [2, 0, 1], [1, 0, 2]):
        assert materialize([changes[i] for i in order], PK) == expected
    assert apply({(1,): (1, "row-a"), (2,): (2, "row-b")}, expected) == {(1,): (1, "row-b"), (2,): (2, "row-a")}


def test_key_update_then_insert_reusing_the_old_key() -> None:
    changes = [
        update(seq(10), (1, "moved"), (2, "moved")),
        insert(seq(20), (1, "newcomer")),
    ]
    expected = {(1,): (1, "newcomer"), (2,): (2, "moved")}
    assert materialize(changes, PK) == expected
    assert materialize(changes[::-1], PK) == expected


def test_delete_of_the_target_then_key_update_onto_it() -> None:
    changes = [
        delete(seq(10), (2, "victim")),
        update(seq(20), (1, "moved"), (2, "moved")),
    ]
    expected = {(1,): None, (2,): (2, "moved")}
    assert materialize(changes, PK) == expected
    assert materialize(changes[::-1], PK) == expected


def test_key_update_and_back_again() -> None:
    changes = [
        update(seq(10), (1, "a"), (2, "a")),
        update(seq(20), (2, "a"), (1, "b")),
    ]
    expected = {(1,): (1, "b"), (2,): None}
    assert materialize(changes, PK) == expected
    assert materialize(changes[::-1], PK) == expected


# --------------------------------------------------------------------------------------------------
# Composite keys
# --------------------------------------------------------------------------------------------------


def test_composite_key_positions_0_and_2() -> None:
    # (tenant, payload, id): the key is (tenant, id); the payload in the middle is not part of it.
    changes = [
        insert(seq(1), ("t1", "p0", 1)),
        insert(seq(2), ("t2", "p0", 1)),  # same id, other tenant: another key
        insert(seq(3), ("t1", "p0", 2)),
        update(seq(4), ("t1", "p0", 1), ("t1", "p1", 1)),  # payload only: same key, no delete
        update(seq(5), ("t1", "p0", 2), ("t3", "p0", 2)),  # the tenant changes: a key change
        update(seq(6), ("t2", "p0", 1), ("t2", "p0", 7)),  # the id changes: a key change
        delete(seq(7), ("t9", "gone", 9)),
    ]
    expected = {
        ("t1", 1): ("t1", "p1", 1),
        ("t2", 1): None,
        ("t1", 2): None,
        ("t3", 2): ("t3", "p0", 2),
        ("t2", 7): ("t2", "p0", 7),
        ("t9", 9): None,
    }
    assert materialize(changes, (0, 2)) == expected
    assert materialize(changes[::-1], (0, 2)) == expected


def test_composite_key_follows_the_order_of_key_positions() -> None:
    changes = [insert(seq(1), ("a", "x", 1))]
    assert materialize(changes, (2, 0)) == {(1, "a"): ("a", "x", 1)}


# --------------------------------------------------------------------------------------------------
# Sequences are (binlog file number, event end position, row index) compared as tuples
# --------------------------------------------------------------------------------------------------


def test_a_later_binlog_file_wins_over_a_larger_position() -> None:
    changes = [
        insert(seq(99999, file=1), (1, "file-1")),
        update(seq(4, file=2), (1, "file-1"), (1, "file-2")),
    ]
    assert materialize(changes, PK) == {(1,): (1, "file-2")}
    assert materialize(changes[::-1], PK) == {(1,): (1, "file-2")}


def test_row_index_orders_rows_of_one_event() -> None:
    # One multi-row event ends at pos 500; the previous one at pos 499 had many rows.
    changes = [
        insert(seq(499, row=7), (1, "a")),
        update(seq(500, row=0), (1, "a"), (1, "b")),
        update(seq(500, row=1), (1, "b"), (1, "c")),
        update(seq(500, row=10), (1, "c"), (1, "d")),
    ]
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [3, 0, 2, 1], [2, 3, 0, 1]):
        assert materialize([changes[i] for i in order], PK) == {(1,): (1, "d")}


# --------------------------------------------------------------------------------------------------
# Shuffled arrival and batch splits, on a generated history
# --------------------------------------------------------------------------------------------------


def generate_history(rng: random.Random, n: int, keys: int) -> tuple[dict[Key, Row], list[Change]]:
    """A valid history of n changes over `keys` keys, starting from a table that already has some rows.

    Sequences advance like a binlog: several rows per event, events at growing positions, and file
    rotations where the position starts again from 4 (so ordering by position alone would be wrong).
    """
    table: dict[int, Row] = {k: (k, f"initial-{k}", 0) for k in range(0, keys, 2)}
    initial = {(k,): row for k, row in table.items()}
    file, pos, row_index = 1, 4, 0
    version = 0
    changes: list[Change] = []
    while len(changes) < n:
        r = rng.random()
        if r < 0.08:
            file, pos, row_index = file + 1, 4 + rng.randrange(50), 0
        elif r < 0.5:
            pos, row_index = pos + rng.randrange(1, 5000), 0
        else:
            row_index += 1
        s = (file, pos, row_index)
        version += 1
        present = sorted(table)
        absent = [k for k in range(keys) if k not in table]
        action = rng.random()
        if not present or (absent and action < 0.25):
            k = rng.choice(absent)
            table[k] = (k, f"v{version}", version)
            changes.append(Change(s, None, table[k]))
        elif action < 0.6:
            k = rng.choice(present)
            before, table[k] = table[k], (k, f"v{version}", version)
            changes.append(Change(s, before, table[k]))
        elif absent and action < 0.8:
            k, new = rng.choice(present), rng.choice(absent)
            before = table.pop(k)
            table[new] = (new, before[1], version)
            changes.append(Change(s, before, table[new]))
        else:
            k = rng.choice(present)
            changes.append(Change(s, table.pop(k), None))
    return initial, changes


def replay(table: dict[Key, Row], changes: list[Change]) -> dict[Key, Row]:
    """The obvious reference: apply every change, in order, to a dict."""
    out = dict(table)
    for c in changes:
        if c.before is not None:
            del out[(c.before[0],)]
        if c.after is not None:
            out[(c.after[0],)] = c.after
    return out


def touched(changes: list[Change]) -> set[Key]:
    return {(img[0],) for c in changes for img in (c.before, c.after) if img is not None}


def test_generated_history_exercises_every_kind_of_change() -> None:
    _, changes = generate_history(random.Random(20240601), 200, 10)
    kinds = {c.op for c in changes}
    key_changes = [c for c in changes if c.before is not None and c.after is not None and c.before[0] != c.after[0]]
    rotations = {c.seq[0] for c in changes}
    assert kinds == {"+I", "+U", "-D"}
    assert len(key_changes) >= 5
    assert len(rotations) >= 5
    assert [c.seq for c in changes] == sorted(c.seq for c in changes)
    assert len({c.seq for c in changes}) == len(changes)
    # Ordering by position alone would scramble the history.
    assert [c.seq for c in changes] != sorted((c.seq for c in changes), key=lambda s: (s[1], s[2]))


def test_ordered_history_equals_a_straightforward_replay() -> None:
    initial, changes = generate_history(random.Random(7), 200, 10)
    final = replay(initial, changes)
    result = materialize(changes, PK)
    assert result == {k: final.get(k) for k in touched(changes)}
    assert apply(initial, result) == final


def test_every_shuffle_gives_the_same_result_as_the_ordered_history() -> None:
    rng = random.Random(12345)
    initial, changes = generate_history(rng, 200, 10)
    final = replay(initial, changes)
    expected = {k: final.get(k) for k in touched(changes)}
    assert materialize(changes, PK) == expected
    assert materialize(changes[::-1], PK) == expected
    for _ in range(50):
        shuffled = changes[:]
        rng.shuffle(shuffled)
        assert shuffled != changes
        assert materialize(shuffled, PK) == expected
        assert materialize(iter(shuffled), PK) == expected


def test_history_split_into_two_batches_composes() -> None:
    rng = random.Random(99)
    initial, changes = generate_history(rng, 200, 10)
    whole = materialize(changes, PK)
    for cut in range(len(changes) + 1):
        first, second = changes[:cut], changes[cut:]
        batch1 = materialize(rng.sample(first, len(first)), PK)
        batch2 = materialize(rng.sample(second, len(second)), PK)
        assert {**batch1, **batch2} == whole, cut
        assert apply(apply(initial, batch1), batch2) == apply(initial, whole), cut


def test_update_halves_split_across_batches() -> None:
    """A -U in one batch and its +U in the next: batch 2 on top of batch 1 equals both at once."""
    # Same key: -U (1, a) ends batch 1, +U (1, b) opens batch 2.
    batch1 = [insert(seq(10), (1, "a")), delete(seq(20, row=0), (1, "a"))]
    batch2 = [insert(seq(20, row=1), (1, "b")), update(seq(30), (1, "b"), (1, "c"))]
    first, second = materialize(batch1, PK), materialize(batch2, PK)
    assert first == {(1,): None}
    assert second == {(1,): (1, "c")}
    assert {**first, **second} == materialize(batch1 + batch2, PK) == {(1,): (1, "c")}
    assert apply(apply({}, first), second) == {(1,): (1, "c")}

    # Key change: -U (1, x) ends batch 1, +U (2, x) opens batch 2, and 1 is reused in batch 2.
    batch1 = [update(seq(40), (5, "p"), (5, "q")), delete(seq(50, row=0), (1, "x"))]
    batch2 = [insert(seq(50, row=1), (2, "x")), insert(seq(60), (1, "reused"))]
    first, second = materialize(batch1, PK), materialize(batch2, PK)
    assert first == {(5,): (5, "q"), (1,): None}
    assert second == {(2,): (2, "x"), (1,): (1, "reused")}
    expected = {(5,): (5, "q"), (1,): (1, "reused"), (2,): (2, "x")}
    assert {**first, **second} == materialize(batch1 + batch2, PK) == expected
    # The same key change as one update gives the same final state.
    as_one = [batch1[0], update(seq(50), (1, "x"), (2, "x")), batch2[1]]
    assert materialize(as_one, PK) == expected
    table = {(1,): (1, "x"), (5,): (5, "p")}
    assert apply(apply(table, first), second) == apply(table, materialize(as_one, PK))


# --------------------------------------------------------------------------------------------------
# A hot key: state does not grow with the number of versions
# --------------------------------------------------------------------------------------------------


def test_nothing_is_kept_beyond_the_batch() -> None:
    changes = [insert(seq(1), (1, "a")), update(seq(2), (1, "a"), (1, "b")), delete(seq(3), (2, "c"))]
    refs = [weakref.ref(c) for c in changes]
    assert materialize(changes, PK) == {(1,): (1, "b"), (2,): None}
    del changes
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    # A second batch starts from nothing: it does not see the first one.
    assert materialize([delete(seq(4), (1, "b"))], PK) == {(1,): None}


def test_hot_key_updated_a_million_times_keeps_one_entry_with_the_last_image() -> None:
    n = 1_000_000
    odd, even = (7, "odd"), (7, "even")
    last = (7, "last")

    def changes() -> Iterator[Change]:
        # Newest first, so that the arrival order is the opposite of the sequence order.
        yield Change((3, 4, 0), even, last)
        for i in range(n - 1, 0, -1):
            yield Change((2, i, 0), odd if i % 2 else even, even if i % 2 else odd)
        yield Change((1, 99999, 0), None, odd)

    # A million short-lived objects: keep the cyclic collector from rescanning them while they pile up.
    gc.disable()
    try:
        result = materialize(changes(), PK)
    finally:
        gc.enable()
    assert len(result) == 1
    assert result == {(7,): last}


# --------------------------------------------------------------------------------------------------
# Keys a batch creates (they may be appended: the target cannot hold them)
# --------------------------------------------------------------------------------------------------


def test_inserted_keys_are_created_and_keys_first_seen_in_a_before_image_are_not() -> None:
    changes = [
        insert(seq(1), (1, "a")),
        update(seq(2), (1, "a"), (1, "b")),
        update(seq(3), (2, "x"), (2, "y")),
        delete(seq(4), (3, "z")),
    ]
    assert created_keys(changes, PK) == {(1,)}


def test_a_key_deleted_then_inserted_again_in_the_batch_existed_before_it() -> None:
    changes = [insert(seq(9), (5, "again")), delete(seq(8), (5, "old"))]  # arrival order is not sequence order
    assert created_keys(changes, PK) == set()


def test_a_row_moved_to_a_new_key_creates_it_and_the_old_key_is_not_created() -> None:
    changes = [update(seq(1), (1, "a"), (7, "a")), update(seq(2), (7, "a"), (8, "a"))]
    assert created_keys(changes, PK) == {(7,), (8,)}


def test_the_keys_a_random_batch_creates_are_the_keys_it_names_that_were_absent_before_it() -> None:
    rng = random.Random(7)
    for _ in range(200):
        table = {(k,): (k, "0") for k in rng.sample(range(20), 8)}
        now, changes = dict(table), []
        for pos in range(1, 30):
            k = (rng.randrange(20),)
            if k in now and rng.random() < 0.5:
                changes.append(delete(seq(pos), now.pop(k)))
            elif k in now:
                moved = (rng.randrange(20),)
                if moved != k and moved in now:
                    continue
                changes.append(update(seq(pos), now[k], (moved[0], str(pos))))
                del now[k]
                now[moved] = (moved[0], str(pos))
            else:
                now[k] = (k[0], str(pos))
                changes.append(insert(seq(pos), now[k]))
        rng.shuffle(changes)
        created = created_keys(changes, PK)
        named = {(image[0],) for c in changes for image in (c.before, c.after) if image is not None}
        assert created == named - table.keys()
