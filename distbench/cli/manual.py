"""The manual's options tables, generated from the command line itself: every command's options
as its --help gives them (flag, default, choices, help), written between the markers
`<!-- options:NAME -->` and `<!-- /options:NAME -->` wherever a page under docs/ holds them
(`make docs`, which runs `python -m distbench.cli.manual`).
`tests/unit/project/test_docs_options.py` regenerates them in memory and fails on a stale page.
The tables read the application the way --help does (its click command), so whatever the
application says, the manual says."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
# The options every benchmark command takes: one table of them (`shared`, on commands.md, from
# the first command that has them all), and one row pointing there in each command's table.
SHARED = ("out", "backend", "timeout", "workers", "config")
SHARED_PAGE = "commands.md"
SHARED_ANCHOR = "options-every-command-shares"
BLOCK = re.compile(r"(<!-- options:([\w-]+)[^>]*-->\n)(.*?)(<!-- /options:\2 -->)", re.S)
_EXTRA = re.compile(r"\s*\[([^\[\]]*)\]\s*$")


def _command():
    import typer.main

    from distbench.cli.app import app

    return typer.main.get_command(app)


def _context(command, name: str, parent):
    return command.context_class(command, info_name=name, parent=parent)


def _cell(text: str) -> str:
    """One table cell of --help's text: on one line, with what markdown would take for a
    table's edge, an HTML tag or emphasis escaped."""
    text = " ".join(str(text).split())
    for char in "|*<>":
        text = text.replace(char, "\\" + char)
    return text


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _row(param, ctx) -> tuple[str, str, str, str, str] | None:
    """(name, flags, default, choices, help) of one parameter, as --help shows it; None for
    --help itself and hidden ones."""
    if getattr(param, "hidden", False) or param.name == "help":
        return None
    record = param.get_help_record(ctx)
    if record is None:
        return None
    shown, text = record
    default = ""
    m = _EXTRA.search(text or "")
    if m:
        text = text[:m.start()]
        for item in m.group(1).split("; "):
            if item.startswith("default: "):
                default = item[len("default: "):]
    names = [*param.opts, *getattr(param, "secondary_opts", [])]
    if getattr(param, "param_type_name", "") == "argument":
        flags = param.name.upper() + ("..." if param.nargs != 1 else "")
    else:
        flags = " / ".join(names)
    choices = getattr(getattr(param, "type", None), "choices", None)
    if not choices:
        metavar = shown[len(", ".join(names)):].strip() if shown else ""
        c = re.fullmatch(r"\[([^\[\]]+\|[^\[\]]+)\]", metavar)
        choices = c.group(1).split("|") if c else None
    return (param.name, flags, default, ", ".join(str(c) for c in choices or ()), text)


def rows(name: str) -> list[tuple[str, str, str, str, str]]:
    """Every option of the command `name` (a command or a tool), in --help's order."""
    group = _command()
    command = group.commands[name]
    ctx = _context(command, name, _root(group))
    return [r for r in (_row(p, ctx) for p in command.get_params(ctx)) if r is not None]


def _root(group):
    """The context --help runs the group in, of the click the application was built on
    (typer's own, or click itself: whichever class the group's contexts are)."""
    return group.context_class(group, info_name="distbench")


def _table(lines: list[tuple[str, str, str, str]]) -> str:
    """The table; a choices column only where some option has its choices listed."""
    if any(choices for _, _, choices, _ in lines):
        out = ["| option | default | choices | meaning |", "|---|---|---|---|"]
        out += [f"| {flags} | {default} | {choices} | {text} |"
                for flags, default, choices, text in lines]
    else:
        out = ["| option | default | meaning |", "|---|---|---|"]
        out += [f"| {flags} | {default} | {text} |" for flags, default, _, text in lines]
    return "\n".join(out) + "\n"


def _line(row: tuple[str, str, str, str, str]) -> tuple[str, str, str, str]:
    _, flags, default, choices, text = row
    def code(text: str) -> str:
        return _code(" ".join(text.split()).replace("|", "\\|"))

    return (code(flags).replace(" / ", "` / `"), code(default),
            ", ".join(code(c.strip()) for c in choices.split(",")) if choices else "",
            _cell(text))


def table(name: str, page: Path) -> str:
    """The markdown table of `name`'s options for `page` (links are relative to it). `shared`:
    the options every benchmark command takes, from the first command that has them all."""
    commands = list(_command().commands)
    if name == "shared":
        source = next(c for c in commands if {r[0] for r in rows(c)} >= set(SHARED))
        picked = [r for r in rows(source) if r[0] in SHARED]
        return _table([_line(r) for r in picked])
    if name not in commands:
        raise LookupError(f"{page}: no command {name!r} for its options block "
                          f"(the commands: {', '.join(commands)})")
    from distbench.kinds import commands

    own, shared = [], []
    for r in rows(name):  # a tool's --out (report, compare) is its own
        (shared if r[0] in SHARED and name in commands() else own).append(r)
    lines = [_line(r) for r in own]
    if shared:
        link = os.path.relpath(DOCS / SHARED_PAGE, page.parent).replace(os.sep, "/")
        flags = ", ".join(_code(r[1]) for r in shared)
        lines.append((flags, "", "", f"the [options every command shares]"
                                     f"({link}#{SHARED_ANCHOR})"))
    return _table(lines)


def render(text: str, page: Path) -> str:
    """`text` with every options block regenerated."""
    return BLOCK.sub(lambda m: m.group(1) + table(m.group(2), page) + m.group(4), text)


def blocks(text: str) -> list[str]:
    """The names of the options blocks in `text`, in order."""
    return [m.group(2) for m in BLOCK.finditer(text)]


def pages(docs: Path = DOCS) -> list[Path]:
    """The pages holding an options block."""
    return sorted(p for p in docs.rglob("*.md") if BLOCK.search(p.read_text(encoding="utf-8")))


def stale(docs: Path = DOCS) -> dict[Path, list[str]]:
    """Each page whose blocks differ from what the application says now, with those blocks."""
    found = {}
    for page in pages(docs):
        text = page.read_text(encoding="utf-8")
        fresh = render(text, page)
        if fresh != text:
            found[page] = [m.group(2) for m in BLOCK.finditer(text)
                           if m.group(3) != table(m.group(2), page)]
    return found


def main(argv: list[str] | None = None) -> int:
    changed = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        fresh = render(text, page)
        if fresh != text:
            page.write_text(fresh, encoding="utf-8")
            changed.append(page)
    for page in changed:
        print(f"distbench.cli.manual: rewrote {page.relative_to(DOCS.parent)}")
    if not changed:
        print("distbench.cli.manual: every options table is current")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
