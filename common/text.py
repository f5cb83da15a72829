"""Text from elsewhere made safe to print: a hostile coordinator's study name or id, or a device's
reason, may carry terminal escape sequences; every line the command line or a log writes from
such text goes through :func:`printable`. Imports nothing, so the device daemon can use it
without loading the command line."""

from __future__ import annotations


def printable(text: str | None) -> str:
    """``text`` (None as "") safe for a terminal or a log line: each control character (a hostile
    coordinator's study name or id could carry escape sequences) as its Python escape."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text or "")
