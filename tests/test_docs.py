"""The documentation's links hold: every `docs/<page>.md#<anchor>` the code, tests, scripts and docs cite names a file that
exists and a heading in it, every relative link of README.md and docs/ resolves, every `docs/data/*.json` or
`docs/img/*` named anywhere exists, and docs/configuration.md lists exactly the fields of rpt/config.py's dataclasses
with their defaults (regenerate it with `python scripts/config_docs.py`)."""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE_DIRS = ("rpt", "tests", "scripts", "benchmarks")


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\*|_(?=\W)|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip()).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in md.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        s = slug(line.lstrip("#"))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def text_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for d in CODE_DIRS:
        files += sorted(p for p in (ROOT / d).rglob("*") if p.suffix in {".py", ".sh", ".md"} and p.is_file())
    return files


def cited() -> list[tuple[str, str]]:
    """(file, reference) for every repository path under docs/ named in code or docs, anchors included."""
    refs = []
    for f in text_files():
        for m in re.finditer(r"(?<![\w/.])docs/[\w./-]+?\.(?:md|json|png)(?:#[\w-]+)?", f.read_text()):
            refs.append((str(f.relative_to(ROOT)), m.group(0)))
    return refs


def relative_links() -> list[tuple[str, Path, str]]:
    """(file, target path, anchor) for every relative Markdown link of README.md and docs/."""
    links = []
    for f in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = re.sub(r"```.*?```", "", f.read_text(), flags=re.S)
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            links.append((str(f.relative_to(ROOT)), (f.parent / path).resolve() if path else f, anchor))
    return links


def test_every_cited_docs_path_and_anchor_exists():
    assert cited(), "found no docs/ reference at all: the pattern is broken"
    bad = []
    for where, ref in cited():
        path, _, anchor = ref.partition("#")
        target = ROOT / path
        if not target.is_file():
            bad.append(f"{where}: {ref} (no such file)")
        elif anchor and anchor not in anchors(target):
            bad.append(f"{where}: {ref} (no such heading)")
    assert not bad, "\n".join(bad)


def test_every_relative_link_in_readme_and_docs_resolves():
    bad = []
    for where, target, anchor in relative_links():
        if not target.exists():
            bad.append(f"{where}: {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target} (missing)")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            bad.append(f"{where}: {target.name}#{anchor} (no such heading)")
    assert not bad, "\n".join(bad)


def test_no_design_md_outside_docs():
    """The design notes the code cites are docs/design.md, by anchor; a bare DESIGN.md names no file here."""
    bad = [str(f.relative_to(ROOT)) for f in text_files()
           if f.name != "test_docs.py" and re.search(r"(?<!docs/)DESIGN\.md", f.read_text())]
    assert not bad, bad


def test_slug_matches_github():
    assert slug("`rpt train --steps` at the 250m preset") == "rpt-train---steps-at-the-250m-preset"
    assert slug("`python -m lab bench`") == "python--m-lab-bench"
    assert slug("Real code, longer: retro's retrieval gain over 1,200 updates") == (
        "real-code-longer-retros-retrieval-gain-over-1200-updates"
    )
    assert slug("Chunked cross-attention") == "chunked-cross-attention"


def config_fields() -> dict[str, str]:
    from rpt.config import RPTConfig

    def fields(obj, prefix):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):  # a nested section (model.cca): one row per field
                yield from fields(value, f"{prefix}{f.name}.")
            else:
                yield f"{prefix}{f.name}", repr(value)

    return dict(fields(RPTConfig(), ""))


def test_configuration_page_lists_every_field_with_its_default():
    page = (ROOT / "docs" / "configuration.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z]+(?:\.[a-z_0-9]+)+)` \| [^`]*\| `([^`]*)` \|", page, flags=re.M))
    want = config_fields()
    missing = sorted(set(want) - set(rows))
    extra = sorted(set(rows) - set(want))
    wrong = sorted(k for k in set(want) & set(rows) if rows[k] != want[k])
    assert not (missing or extra or wrong), (
        f"docs/configuration.md is out of date (python scripts/config_docs.py): missing {missing}, not in the "
        f"config {extra}, other default {[(k, rows[k], want[k]) for k in wrong]}"
    )


@pytest.mark.parametrize("page", ["cli.md", "design.md", "corpora.md", "configuration.md", "results/index.md"])
def test_docs_pages_exist(page):
    assert (ROOT / "docs" / page).is_file()


def test_every_benchmark_is_listed_and_backs_a_documented_figure():
    """benchmarks/README.md lists every script there, and each is named by a page of docs/ (where its figure is)."""
    listing = (ROOT / "benchmarks" / "README.md").read_text()
    pages = " ".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))
    assert scripts
    assert not [s for s in scripts if f"| `{s}` |" not in listing], "benchmarks missing from benchmarks/README.md"
    assert not [s for s in scripts if s not in pages], "benchmarks no page of docs/ names"


def test_readme_results_are_short_enough_to_read():
    """README's results: at most five lines of text before the table, and one sentence of about 200 characters at
    most per finding; the detail lives on the pages."""
    section = README_RESULTS.search((ROOT / "README.md").read_text())
    assert section, "README.md has no '## Results' section"
    text = section.group(1).strip().split("\n\n")
    assert len(text[0].splitlines()) <= 5, text[0]
    rows = [r for r in section.group(1).splitlines() if r.startswith("| ") and not r.startswith("| question")]
    assert len(rows) >= 5
    for row in rows:
        finding = [c.strip() for c in row.strip().strip("|").split("|")][1]
        assert len(finding) <= 210, f"{len(finding)} characters: {finding}"


README_RESULTS = re.compile(r"^## Results\n(.*?)^## ", re.S | re.M)
