"""MkDocs hook: fills the environment-variable reference from bytesched.core.config at build time.

The table is never written by hand: ``reference/variables.md`` holds the marker below, and every
build replaces it with one row per entry of :func:`bytesched.core.config.describe_variables`
(the same table ``from_env`` validates against), so the docs cannot drift from the code.
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- variables-table -->"


def variables_table() -> str:
    """The Markdown table of every ``BYTESCHED_*`` variable: name, default, meaning."""
    from bytesched.core.config import describe_variables

    rows = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for name, default, doc in describe_variables():
        cells = [f"`{name}`", default or "", doc]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace the marker on the reference page; fail the build if that page lost its marker."""
    if page.file.src_uri != "reference/variables.md":
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/reference/variables.md must contain {MARKER} (where the generated table goes)")
    return markdown.replace(MARKER, variables_table())
