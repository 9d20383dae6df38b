"""A generated section of a docs page: the text between two HTML-comment markers, replaced by a
benchmark's report so that the rest of the page is never touched."""

from __future__ import annotations

import re
from pathlib import Path


def replace_section(page: Path, begin: str, end: str, section: str) -> None:
    """Replace the text from ``begin`` to ``end`` in ``page`` with ``section`` (which carries the
    markers itself); append it if the page has no markers yet."""
    text = page.read_text() if page.exists() else ""
    if begin in text and end in text:
        text = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S).sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    page.write_text(text)
