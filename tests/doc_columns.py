"""The CSV columns docs/columns.md documents, read from the page: the contract every test that
checks a written CSV holds it to."""

from __future__ import annotations

import re

from paths import REPO

RESULTS_MD = REPO / "docs" / "results.md"

COLUMNS_MD = RESULTS_MD.parent / "columns.md"

_CELL = re.compile(r"^`([a-z0-9_]+)`$")


def documented_columns(csv_name: str, text: str | None = None) -> list[str]:
    """The columns of the `| column | meaning |` table under the heading ``## `csv_name` ``
    of docs/columns.md (or of `text`), in order."""
    lines = (COLUMNS_MD.read_text() if text is None else text).splitlines()
    heading = f"## `{csv_name}`"
    if heading not in lines:
        raise LookupError(f"docs/columns.md has no heading {heading!r}")
    section = []
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("## "):
            break
        section.append(line.strip())
    tables = [i for i, line in enumerate(section)
              if [c.strip() for c in line.strip("|").split("|")] == ["column", "meaning"]]
    if len(tables) != 1:
        raise LookupError(f"{heading}: expected one '| column | meaning |' table, found "
                          f"{len(tables)}")
    columns = []
    for line in section[tables[0] + 2:]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        cell = line.strip("|").split("|")[0].strip()
        m = _CELL.match(cell)
        if m is None:
            raise LookupError(f"{heading}: {cell!r} is no `column` name")
        columns.append(m.group(1))
    return columns
