"""Text that came from a device or a candidate is data.

It is never interpreted as rich markup and never reaches a terminal with its control characters:
``device_text`` escapes C0/C1 controls and DEL (``\\x1b`` is shown as the four characters ``\\x1b``),
drops lone surrogates and caps the length. It is applied where device text enters the host (the
agent result validator, ``info``) and again where text is printed (``safe``), which also escapes
rich markup so ``[/bold]`` prints as itself. The reports have their own forms: ``md_text`` and
``md_code`` for Markdown (no links, HTML or table breaks from the device), ``html_text`` for HTML.
"""

from __future__ import annotations

import html
import re
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
        elif 0xD800 <= o < 0xE000 or o in (0x2028, 0x2029, 0x200E, 0x200F, 0x061C) or 0x202A <= o <= 0x202E \
                or 0x2066 <= o <= 0x2069:
            out.append(f"\\u{o:04x}")  # surrogates, line separators, bidi marks and overrides (Trojan Source)
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


_MD_SPECIAL = re.compile(r"([\\`*\[\]<>|&])")


def md_text(value: Any, limit: int = MAX_TEXT) -> str:
    """Device text for Markdown (a table cell or a line): controls escaped as in ``device_text``,
    then every character that could start a link, an image, HTML, an entity, code, emphasis or a
    table cell backslash-escaped (CommonMark), so it renders as the text it is."""
    return _MD_SPECIAL.sub(r"\\\1", device_text(value, limit))


def md_code(value: Any, limit: int = MAX_TEXT) -> str:
    """Device text as a Markdown code span, fenced with more backticks than it contains. Not for
    table cells: GitHub's tables split on ``|`` even inside code."""
    text = device_text(value, limit)
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def html_text(value: Any, limit: int = MAX_TEXT) -> str:
    """Device text for HTML: controls and bidi overrides escaped as in ``device_text``, then
    HTML-escaped (quotes included, so it is safe in an attribute too)."""
    return html.escape(device_text(value, limit), quote=True)
