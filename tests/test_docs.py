"""The documentation site builds with `mkdocs build --strict` (a broken link or nav entry fails),
and its variable reference lists every BYTESCHED_* variable the configuration module knows."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path

from bytesched.core.config import VARIABLES, describe_variables

from conftest import REPO_ROOT, require_executable


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the project at ``root`` into ``site``."""
    mkdocs = require_executable("mkdocs")
    return subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(site)], cwd=root, capture_output=True,
                          text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(mkdocs.parent)})


def test_site_builds_strictly_and_lists_every_variable(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = build(REPO_ROOT, site)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = html.unescape((site / "reference" / "variables" / "index.html").read_text())
    rows = re.findall(r"<tr>\s*<td><code>(BYTESCHED\w+)</code></td>", page)
    assert {v.name for v in VARIABLES} <= set(rows)
    assert rows == [name for name, _, _ in describe_variables()]  # in the module's order, none extra
    assert "variables-table" not in page  # the marker was replaced
    for page_name in ("index", "quickstart", "troubleshooting", "comparison"):
        assert (site / (page_name + ".html" if page_name == "index" else f"{page_name}/index.html")).exists()


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(REPO_ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "mkdocs.yml", tmp_path)
    with open(tmp_path / "docs" / "index.md", "a", encoding="utf-8") as index:
        index.write("\n[gone](no-such-page.md) and [moved](architecture.md#no-such-section)\n")
    proc = build(tmp_path, tmp_path / "site")
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stderr and "no-such-section" in proc.stderr, proc.stderr
