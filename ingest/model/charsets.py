"""What MySQL's and MariaDB's character sets can hold: whether a column converted from one set to another keeps
every value it may hold, and how many bytes a character takes in each.

The servers convert a text column's values through Unicode when its character set changes (`CONVERT TO
CHARACTER SET`, or `CHARACTER SET` in `MODIFY` / `CHANGE`, or a redefinition that falls back to the table's
default set). A character the new set lacks becomes `?` in every old row, with a warning only, unless the
statement ran under a strict sql_mode, where it fails instead (error 1366). So a conversion keeps every value
exactly when the new set's repertoire holds the old one's (`holds`). Pure data, no server; an allow-list: a pair
of sets not known to hold each other is taken as one that does not.
"""

from __future__ import annotations

UNICODE = frozenset({"utf8mb4", "utf16", "utf16le", "utf32", "gb18030"})
"""Sets that hold every Unicode character (gb18030 is MySQL's; it maps all of Unicode)."""
BMP = frozenset({"utf8mb3", "utf8", "ucs2"})
"""Sets that hold Unicode's Basic Multilingual Plane only (no emoji, no supplementary CJK)."""
LEGACY = frozenset(
    {"armscii8", "ascii", "big5", "cp1250", "cp1251", "cp1256", "cp1257", "cp850", "cp852", "cp866", "cp932",
     "dec8", "eucjpms", "euckr", "gb2312", "gbk", "geostd8", "greek", "hebrew", "hp8", "keybcs2", "koi8r",
     "koi8u", "latin1", "latin2", "latin5", "latin7", "macce", "macroman", "sjis", "swe7", "tis620", "ujis"}
)  # fmt: skip
"""The servers' sets that are not Unicode: every character of each maps into the BMP."""
_ASCII_CHANGED = frozenset({"swe7"})
"""A legacy set that puts other letters at some ASCII codes (Swedish letters for `[\\]{|}` and others)."""

_MAX_BYTES = {
    "big5": 2, "cp932": 2, "eucjpms": 3, "euckr": 2, "gb2312": 2, "gbk": 2, "gb18030": 4, "sjis": 2, "ujis": 3,
    "ucs2": 2, "utf16": 4, "utf16le": 4, "utf32": 4, "utf8mb3": 3, "utf8": 3, "utf8mb4": 4,
}  # fmt: skip
"""The most bytes one character takes (information_schema.CHARACTER_SETS.MAXLEN); 1 for every set not named."""
_MIN_BYTES = {"ucs2": 2, "utf16": 2, "utf16le": 2, "utf32": 4}
"""The fewest bytes one character takes; 1 for every set not named."""


def holds(old: str | None, new: str | None) -> bool:
    """Whether every character a value in set `old` can hold is a character of set `new` (None: not known, or
    binary, which is no set of characters: held only by the same)."""
    if old is None or new is None:
        return old == new
    a, b = old.lower(), new.lower()
    if a == b or b in UNICODE and (a in UNICODE | BMP | LEGACY):
        return True
    if b in BMP:
        return a in BMP | LEGACY
    return a == "ascii" and b in LEGACY - _ASCII_CHANGED


def max_bytes(charset: str | None) -> int:
    """The most bytes a character of the set takes."""
    return _MAX_BYTES.get(charset.lower(), 1) if charset else 1


def min_bytes(charset: str | None) -> int:
    """The fewest bytes a character of the set takes."""
    return _MIN_BYTES.get(charset.lower(), 1) if charset else 1


_UTF8 = frozenset({"utf8mb3", "utf8", "utf8mb4"})


def same_bytes(old: str | None, new: str | None) -> bool:
    """Whether a value of set `old` takes no more bytes in set `new`: between UTF-8's three- and four-byte forms a
    character keeps its bytes (one the new set lacks becomes a one-byte `?`), and ASCII keeps them in a set that
    extends it. A TEXT's value then fits a TEXT of the same capacity."""
    if old is None or new is None:
        return old == new
    a, b = old.lower(), new.lower()
    return a == b or (a in _UTF8 and b in _UTF8) or (a == "ascii" and b in _UTF8 | LEGACY - _ASCII_CHANGED)
