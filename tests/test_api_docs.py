"""docs/api.md is generated from the docstrings (scripts/api_docs.py): the committed page must be current."""

from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_api_page_is_current():
    page = runpy.run_path(str(ROOT / "scripts" / "api_docs.py"))["page"]()  # what the script prints, in this process
    committed = (ROOT / "docs" / "api.md").read_text()
    assert page == committed, "docs/api.md is stale: run `python scripts/api_docs.py > docs/api.md`"
