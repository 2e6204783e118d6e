"""The manual's options tables are made from the command line (`make docs`, that is
`python -m distbench.cli.manual`): regenerated here in memory, a table that differs from what
the application says now fails, naming the command and the page."""

from __future__ import annotations

from distbench.cli import manual
from distbench.kinds import commands, tools


def test_every_options_table_is_what_the_command_line_says():
    stale = manual.stale()
    assert not stale, "options tables out of date with the command line: " + "; ".join(
        f"{page.relative_to(manual.DOCS.parent)} ({', '.join(names)})"
        for page, names in stale.items()) + ": run `make docs`"


def test_every_command_has_one_options_table_and_the_shared_options_one():
    found: dict[str, list[str]] = {}
    for page in manual.pages():
        for name in manual.blocks(page.read_text(encoding="utf-8")):
            found.setdefault(name, []).append(str(page.relative_to(manual.DOCS)))
    wanted = {*commands(), *tools(), "shared"}
    assert set(found) == wanted, f"missing {sorted(wanted - set(found))}, unknown " \
                                 f"{sorted(set(found) - wanted)}"
    assert all(len(at) == 1 for at in found.values()), found


def test_a_table_has_every_option_but_help_and_points_shared_ones_to_one_place():
    text = manual.table("tp", manual.DOCS / "commands" / "tp.md")
    flags = [line.split("|")[1].strip() for line in text.splitlines()[2:]]
    assert "`--hidden-size`" in flags and any(f.startswith("`--check`") for f in flags)
    assert not any("--help" in f for f in flags)
    assert flags[-1].startswith("`--out`") and "--workers" in flags[-1]
    assert "(../commands.md#options-every-command-shares)" in text.splitlines()[-1]


def test_a_stale_table_is_found_and_named(tmp_path):
    page = tmp_path / "docs" / "x.md"
    page.parent.mkdir()
    page.write_text("# x\n\n<!-- options:tp -->\n| old |\n<!-- /options:tp -->\n\nafter\n")
    assert [p.name for p in manual.stale(page.parent)] == ["x.md"]
    assert manual.stale(page.parent)[page] == ["tp"]
    fresh = manual.render(page.read_text(), page)
    assert fresh.startswith("# x\n\n<!-- options:tp -->\n| option |") \
        and fresh.endswith("<!-- /options:tp -->\n\nafter\n")
    page.write_text(fresh)
    assert manual.stale(page.parent) == {}
