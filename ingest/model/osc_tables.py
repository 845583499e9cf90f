"""The tables online schema change tools make beside a table (pt-online-schema-change, gh-ost), told by name:
discovery leaves them out, and the binlog reader follows their swaps (`ddl`)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

OscRole = Literal["new", "old", "ghost", "changelog", "sentry"]
# pt-online-schema-change: _t_new (the altered copy; more leading underscores when the name is taken), _t_old
# (the original after the swap, with --no-drop-old-table). gh-ost: _t_gho (the altered copy), _t_ghc (its
# changelog), _t_del (the original after the cut-over, and the sentry table of the atomic cut-over), optionally
# with a timestamp: _t_20260102150405_del.
_OSC_NAME = re.compile(r"^_+(?P<base>.+?)(?:_\d{14})?_(?P<suffix>new|old|gho|ghc|del)$", re.DOTALL)
_ROLES: dict[str, OscRole] = {"new": "new", "old": "old", "gho": "ghost", "ghc": "changelog", "del": "old"}


@dataclass(frozen=True)
class OscHelper:
    """A table an online schema change tool made for `base` (same database)."""

    base: str
    role: OscRole
    tool: Literal["pt-online-schema-change", "gh-ost"]


def osc_helper(table: str, tables_of_database: Iterable[str]) -> OscHelper | None:
    """The helper `table` is of an online schema change of one of `tables_of_database` (None: it is not one).

    Only a name of the tools' forms whose base table exists (or existed) in the same database counts, so a
    table that merely ends in `_new` is an ordinary table.
    """
    m = _OSC_NAME.match(table)
    if m is None:
        return None
    known = {t.lower() for t in tables_of_database}
    base = m["base"]
    if base.lower() not in known:
        return None
    suffix = m["suffix"]
    tool: Literal["pt-online-schema-change", "gh-ost"] = (
        "pt-online-schema-change" if suffix in ("new", "old") else "gh-ost"
    )
    return OscHelper(base, _ROLES[suffix], tool)
