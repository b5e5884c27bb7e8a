"""The docs index links every page of docs/ (and each link it has leads to a file)."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_docs_index_lists_every_page() -> None:
    index = (DOCS / "index.md").read_text()
    links = set(re.findall(r"\]\(([^)#]+)\)", index))
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    assert sorted(pages - links) == [], "add these pages to docs/index.md"
    assert [link for link in links if not (DOCS / link).exists()] == []
