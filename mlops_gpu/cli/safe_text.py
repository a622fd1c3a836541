"""Showing user-supplied strings literally on a terminal.

Run names, commands, reasons, project, user and node names, event texts: anything a user (or a
cluster's admin, or a run's own output) wrote reaches every reader's terminal through the read
verbs. ``visible`` is the one function every human view passes such strings through.

Invariants:
- ``visible(s)`` holds no character that a terminal acts on or that reorders the text around
  it: C0 and C1 controls (ESC, BEL, CR, LF, TAB, DEL included), lone surrogates (the
  surrogateescape form of bytes that are not UTF-8; printing one raises), line and paragraph
  separators and the Unicode bidi controls (U+061C, U+200E, U+200F, U+202A..U+202E,
  U+2066..U+2069) are shown as Python-style escapes (``\\x1b``, ``\\u202e``, ``\\n``; the
  surrogate of a byte that was not UTF-8 as that byte, ``\\xff``, as backslashreplace would); a
  backslash is shown as itself, so a name spelled ``\\x1b`` and one holding ESC can be told
  apart only in ``--json`` (the exact value).
- ``cell(s)`` is a rich ``Text``: rich never parses it as markup (``[/bold]`` is shown as typed
  and cannot raise ``MarkupError``) nor as emoji codes (``:smile:``).
- With a ``limit``, at most ``limit`` characters of the original are shown, followed by
  ``…(+N chars)``: a 100 KB name costs one table cell, not a screenful. ``--json`` is exact.
"""

from __future__ import annotations

import unicodedata
from typing import Any

#: Characters shown as themselves although their category would otherwise be escaped: none.
#: Escaped beyond the categories below: the bidi controls (format characters, category Cf,
#: which otherwise are kept: zero-width joiners make emoji and some scripts).
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
#: Characters of a table cell by default (``cell``): about two lines of a wide terminal.
CELL_LIMIT = 200
#: Characters of a reason (the scheduler's sentences, which quote names): a few lines.
REASON_LIMIT = 1000


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    n = ord(ch)
    if 0xDC80 <= n <= 0xDCFF:  # surrogateescape: the byte 0xNN that was not UTF-8
        return f"\\x{n - 0xDC00:02x}"
    if n < 0x100:
        return f"\\x{n:02x}"
    if n < 0x10000:
        return f"\\u{n:04x}"
    return f"\\U{n:08x}"


def _needs_escape(ch: str) -> bool:
    return ch in _BIDI or unicodedata.category(ch) in _ESCAPED_CATEGORIES


def visible(text: object, limit: int | None = None) -> str:
    """``text`` (``str()`` of it) with control, bidi and lone-surrogate characters escaped,
    cut after ``limit`` characters (with a note of how many more there were)."""
    s = text if isinstance(text, str) else str(text)
    more = 0
    if limit is not None and len(s) > limit:
        s, more = s[:limit], len(s) - limit
    # Fast path: most names are plain printable ASCII.
    if not (s.isascii() and s.isprintable()):
        s = "".join(_escape(ch) if _needs_escape(ch) else ch for ch in s)
    return f"{s}…(+{more} chars)" if more else s


def was_cut(text: object, limit: int | None = CELL_LIMIT) -> bool:
    return limit is not None and len(text if isinstance(text, str) else str(text)) > limit


def cell(text: object, limit: int | None = CELL_LIMIT, style: str = "") -> Any:
    """A rich ``Text`` showing ``text`` literally (``visible``), never parsed as markup."""
    from rich.text import Text

    return Text(visible(text, limit), style=style)
