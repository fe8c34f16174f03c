"""Text that came from a device or a candidate is data.

It is never interpreted as rich markup and never reaches a terminal with its control characters:
``device_text`` escapes C0/C1 controls and DEL (``\\x1b`` is shown as the four characters ``\\x1b``),
drops lone surrogates and caps the length. It is applied where device text enters the host (the
agent result validator, ``info``) and again where text is printed (``safe``), which also escapes
rich markup so ``[/bold]`` prints as itself.
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.text import Text

MAX_TEXT = 2000  # characters kept of one device-supplied string (reasons, names, versions)


def device_text(value: Any, limit: int = MAX_TEXT) -> str:
    """``value`` as a printable one-line string: controls escaped, at most ``limit`` characters."""
    s = value if isinstance(value, str) else str(value)
    if len(s) > 4 * limit:
        s = s[: 4 * limit]
    out = []
    for ch in s:
        o = ord(ch)
        if o < 0x20 or 0x7F <= o < 0xA0:
            out.append("\\n" if ch == "\n" else "\\t" if ch == "\t" else f"\\x{o:02x}")
        elif 0xD800 <= o < 0xE000 or o in (0x2028, 0x2029, 0x200E, 0x200F) or 0x202A <= o <= 0x202E \
                or 0x2066 <= o <= 0x2069:
            out.append(f"\\u{o:04x}")  # surrogates, line separators, bidi overrides (Trojan Source)
        else:
            out.append(ch)
    r = "".join(out)
    return r if len(r) <= limit else r[: limit - 1] + "…"


def safe(value: Any, limit: int = MAX_TEXT) -> str:
    """Device text ready to be embedded in a rich markup string."""
    return escape(device_text(value, limit))


def plain(value: Any, style: str = "", limit: int = MAX_TEXT) -> Text:
    """Device text as a rich ``Text`` (never parsed as markup)."""
    return Text(device_text(value, limit), style=style)
