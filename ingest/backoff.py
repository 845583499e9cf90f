"""How long to wait before trying again what failed because a server could not be reached: the binlog reader and a
chunk read reconnecting to the source (ingest.source.reconnect), a batch's commit waiting for the sink
(ingest.sink.outage)."""

from __future__ import annotations

import random

FIRST_WAIT_SECONDS = 0.5
MAX_WAIT_SECONDS = 10.0


def next_wait(attempts: int, left: float, jitter: random.Random) -> float:
    """The wait after the `attempts`-th failure of a streak: FIRST_WAIT_SECONDS doubling up to MAX_WAIT_SECONDS, give
    or take 20 % (so that many clients do not come back at once), never past the `left` seconds of the budget."""
    wait = min(MAX_WAIT_SECONDS, FIRST_WAIT_SECONDS * 2.0 ** min(attempts - 1, 16))
    return min(wait * (0.8 + 0.4 * jitter.random()), left)
