"""The manual's shape: no page under docs/ is over 500 lines (a longer one is split by topic,
and dated figures go to docs/measurements/, one file per benchmark), and every relative link in
docs/ and README.md reaches a file that exists and, where it names one, a heading that the
page has (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from paths import REPO

DOCS = REPO / "docs"
MAX_LINES = 500
PAGES = sorted(DOCS.rglob("*.md"))
_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """`text` without its fenced code blocks and inline code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a markdown page: lowercased, punctuation but
    hyphens and underscores dropped, spaces as hyphens, a repeated one numbered."""
    found: set[str] = set()
    for line in re.sub(r"^```.*?^```", "", text, flags=re.M | re.S).splitlines():
        m = re.match(r"^#{1,6} (.+?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n, unique = 0, slug
        while unique in found:
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    return found


def links(path: Path) -> list[tuple[Path, str | None, str]]:
    """Every relative link of a page: (the file it names, its anchor or None, the link)."""
    out = []
    for target in _LINK.findall(_prose(path.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        out.append(((path.parent / file).resolve() if file else path, anchor or None, target))
    return out


def test_the_anchors_are_githubs():
    text = "# `distbench collective`\n## Is distbench's overhead nil?\n## The plan and " \
           "`--dry-run`\n## `p2p_matrix.csv`\n## Options\n## Options\n```\n# not a heading\n```\n"
    assert anchors(text) == {"distbench-collective", "is-distbenchs-overhead-nil",
                             "the-plan-and---dry-run", "p2p_matrixcsv", "options", "options-1"}


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_no_page_is_over_500_lines(page):
    lines = len(page.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, (
        f"{page.relative_to(REPO)} has {lines} lines, over {MAX_LINES}: split it by topic "
        f"(docs/commands/ holds a page per command), and move dated figures to "
        f"docs/measurements/")


@pytest.mark.parametrize("page", [*PAGES, REPO / "README.md"],
                         ids=[str(p.relative_to(REPO)) for p in [*PAGES, REPO / "README.md"]])
def test_every_relative_link_reaches_its_file_and_heading(page):
    broken = []
    for file, anchor, target in links(page):
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" \
                and anchor not in anchors(file.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading with that anchor in {file.name}")
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_every_measurements_file_says_how_to_rerun_it_and_is_listed():
    folder = DOCS / "measurements"
    index = (folder / "README.md").read_text(encoding="utf-8")
    for path in sorted(folder.glob("*.md")):
        if path.name == "README.md":
            continue
        head = "\n".join(path.read_text(encoding="utf-8").splitlines()[:6])
        assert "How to rerun:" in head, f"{path.name} opens without how to rerun it"
        assert f"]({path.name})" in index, f"measurements/README.md does not list {path.name}"
