"""The README's command table and docs/cli.md say what the command line has: no more, no less.

The commands and options are read from the typer app itself (plugin commands registered through the
``surgery.commands`` entry points, such as ``experts``, included), so a new option that is not
documented, or a documented option that was renamed or removed, fails here with a message that says
what to add or remove and where.

* docs/cli.md has a ``## `surgery COMMAND ...` `` section for every command (a group's subcommands,
  ``experts build`` and ``experts show``, may share one), and that section names every visible option;
* every ``--option`` named in a docs/cli.md command section is one of that command's options (or a
  root option, ``--debug``/``--allow-pickle``/``--help``);
* every shell line ``surgery COMMAND ... --option`` in README.md and docs/*.md uses options COMMAND
  has, and names a command that exists;
* the README's command table lists every command.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer

from surgery.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
CLI_DOC = ROOT / "docs" / "cli.md"
README = ROOT / "README.md"
OPTION = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")


@dataclass(frozen=True)
class Command:
    """One runnable command of the app: its full name, its visible long options and all its long options."""

    name: str
    visible: frozenset[str]
    every: frozenset[str]
    hidden: bool


def cli_commands(typer_app: typer.Typer) -> dict[str, Command]:
    """Every command of ``typer_app`` (a group's subcommands as ``GROUP SUB``), walked through its click objects."""
    found: dict[str, Command] = {}

    def walk(group: object, prefix: str) -> None:
        for name, command in group.commands.items():  # type: ignore[attr-defined]
            if hasattr(command, "commands"):  # a group, such as `experts`
                walk(command, f"{prefix}{name} ")
                continue
            options = [p for p in command.params if p.param_type_name == "option"]
            long = lambda names: frozenset(n for n in names if n.startswith("--"))  # noqa: E731
            found[prefix + name] = Command(
                name=prefix + name,
                # the primary names (--refit, not --no-refit) of what --help shows
                visible=frozenset().union(*(long(p.opts) for p in options if not p.hidden)),
                every=frozenset().union(*(long([*p.opts, *p.secondary_opts]) for p in options)) | {"--help"},
                hidden=bool(command.hidden))

    walk(typer.main.get_command(typer_app), "")
    return found


def example_plugin_commands() -> dict[str, Command]:
    """The command that the example plugin package of docs/writing-a-strategy.md adds (tests/plugin_pkg)."""
    spec = importlib.util.spec_from_file_location("surgery_ffn_align_cli_docs",
                                                  ROOT / "tests" / "plugin_pkg" / "surgery_ffn_align_cli.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports only typer
    plugin_app = typer.Typer()
    plugin_app.callback()(lambda: None)  # a group, as surgery's app is, so that a single command keeps its name
    module.register(plugin_app)
    return cli_commands(plugin_app)


COMMANDS = cli_commands(app)
#: Commands a doc may name beyond surgery's own, by doc: the guide's example plugin adds one.
EXTRA_COMMANDS = {"writing-a-strategy.md": example_plugin_commands()}
ROOT_OPTIONS = frozenset(o for p in typer.main.get_command(app).params for o in p.opts) | {"--help"}


def sections(text: str) -> dict[str, str]:
    """docs/cli.md's ``## `surgery ...` `` sections (with their ### subsections) by the heading's command words."""
    found: dict[str, str] = {}
    for part in re.split(r"^(?=## )", text, flags=re.M):
        heading = re.match(r"## `surgery ([a-z][a-z0-9-]*)(?: ([a-z][a-z0-9-]*))?", part)
        if heading:
            found[" ".join(w for w in heading.groups() if w)] = part
    return found


def section_of(command: str, by_heading: dict[str, str]) -> tuple[str, str] | None:
    """The heading key and text documenting ``command``: its own section, else its group's (``experts ...``)."""
    if command in by_heading:
        return command, by_heading[command]
    group = command.split()[0]
    shared = [key for key in by_heading if key.split()[0] == group]
    return (shared[0], by_heading[shared[0]]) if shared else None


def shell_lines(text: str) -> list[str]:
    """Command lines of a Markdown text: each line of its non-Python code blocks (continuations joined) and
    each inline code span."""
    lines: list[str] = []
    for block in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S):
        if block.group(1) not in ("python", "yaml", "json", "toml"):
            lines.extend(block.group(2).replace("\\\n", " ").splitlines())
    lines.extend(re.findall(r"`([^`\n]+)`", without_blocks(text)))
    return lines


def without_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


#: What may stand before ``surgery`` in a shell command: a prompt, variable assignments.
PREFIX = re.compile(r"^\s*(?:\$\s+)?(?:[A-Z_]+=\S*\s+)*")
TOP_LEVEL = {name.split()[0] for name in COMMANDS}


def invocations(text: str, known: dict[str, Command] | None = None) -> list[tuple[str, list[str], str]]:
    """Each ``surgery COMMAND ...`` command in the shell lines of ``text`` (a shell line, or one after ``&&``,
    ``;`` or ``|``): the command's name, the options it names, and the line. An inline span that starts with
    a command's name and an option (`` `bench --json` ``) counts as that command too."""
    known = known or COMMANDS
    found = []
    for line in shell_lines(text):
        line = line.split(" #")[0].strip()  # a shell comment
        starts_with_command = re.match(r"([a-z][a-z0-9-]*) --", line)
        if starts_with_command and starts_with_command.group(1) in {n.split()[0] for n in known}:
            line = f"surgery {line}"
        for part in re.split(r"&&|\|\||[;|]", line):
            part = re.split(r"\s[0-9]?>", PREFIX.sub("", part))[0]  # up to a redirection
            words = part.split()
            if not words or words[0] != "surgery":
                continue
            words = words[1:]
            while words and words[0] in ROOT_OPTIONS:
                words = words[1:]
            if not words or not re.fullmatch(r"[a-z][a-z0-9-]*", words[0]):
                continue  # `surgery --help`, `surgery COMMAND`: a placeholder
            name = " ".join(words[:2]) if " ".join(words[:2]) in known else words[0]
            found.append((name, OPTION.findall(" ".join(words[1:])), line))
    return found


def doc_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


# -- docs/cli.md: a section per command, naming every option and no other ------------------------
def test_docs_cli_md_names_every_option_of_every_command() -> None:
    by_heading = sections(CLI_DOC.read_text())
    missing = []
    for name, command in sorted(COMMANDS.items()):
        if command.hidden:
            continue
        found = section_of(name, by_heading)
        if found is None:
            missing.append(f"docs/cli.md has no section for `surgery {name}`: add a heading "
                           f"'## `surgery {name} ...`' that names its options {sorted(command.visible)}")
            continue
        key, text = found
        named = set(OPTION.findall(text))
        for option in sorted(command.visible - named):
            missing.append(f"docs/cli.md does not name {option} of `surgery {name}`: add it (with what it does) to "
                           f"the section '## `surgery {key} ...`'")
    assert not missing, "\n".join(missing)


def test_docs_cli_md_sections_name_only_options_their_command_has() -> None:
    by_heading = sections(CLI_DOC.read_text())
    wrong = []
    for key, text in by_heading.items():
        owners = [c for n, c in COMMANDS.items() if n == key or n.split()[0] == key.split()[0]]
        assert owners, f"docs/cli.md has a section '## `surgery {key} ...`' but the CLI has no command {key!r}"
        allowed = frozenset().union(*(c.every for c in owners)) | ROOT_OPTIONS
        # Options inside a `surgery OTHER ...` line belong to OTHER (checked below); the rest to this section.
        prose = re.sub(r"`[^`\n]+`", lambda span: " " if invocations(span.group(0)) else span.group(0),
                       without_blocks(text))
        for option in sorted(set(OPTION.findall(prose)) - allowed):
            wrong.append(f"docs/cli.md, section '## `surgery {key} ...`', names {option}, which `surgery {key}` does "
                         f"not have: remove it or name the command it belongs to")
    assert not wrong, "\n".join(wrong)


# -- every `surgery COMMAND --option` line in the docs is a real one -----------------------------
@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.name)
def test_every_command_line_in_the_docs_uses_real_commands_and_options(path: Path) -> None:
    wrong = []
    known = {**COMMANDS, **EXTRA_COMMANDS.get(path.name, {})}
    for name, options, line in invocations(path.read_text(), known):
        if name not in known:
            if name in TOP_LEVEL:
                continue  # `surgery experts ...` without a subcommand: the group itself
            wrong.append(f"{path.relative_to(ROOT)}: `{line}` names a command `surgery {name}` the CLI does not "
                         f"have (commands: {', '.join(sorted(known))})")
            continue
        for option in options:
            if option not in known[name].every | ROOT_OPTIONS:
                wrong.append(f"{path.relative_to(ROOT)}: `{line}` passes {option}, which `surgery {name}` does not "
                             f"have: fix the line (options: {', '.join(sorted(known[name].visible))})")
    assert not wrong, "\n".join(wrong)


def test_the_readme_command_table_lists_every_command() -> None:
    table = re.search(r"^## Command line\n(.*?)^## ", README.read_text(), flags=re.M | re.S)
    assert table, "README.md has no '## Command line' section with the command table"
    rows = [line for line in table.group(1).splitlines() if line.startswith("| `surgery")]
    listed = {name for row in rows for name, _, _ in invocations(row.split("|")[1])}
    for name, command in sorted(COMMANDS.items()):
        if not command.hidden:
            assert name in listed, (f"README.md's command table (## Command line) has no row for `surgery {name}`: add "
                                    f"'| `surgery {name} ...` | what it does |'")


def test_the_checks_catch_a_missing_and_a_made_up_option() -> None:
    """The parsers above find what they must: a made-up option in a line, an undocumented one in a section."""
    (name, options, _), = invocations("```bash\nsurgery export out/m --out x --int9 --overwrite\n```\n")
    assert name == "export" and "--int9" in options and "--int9" not in COMMANDS["export"].every
    found = invocations("see `surgery experts build M --task a=f.csv --out o` and `surgery --debug bench M --json f`")
    assert [(n, o) for n, o, _ in found] == [("experts build", ["--task", "--out"]), ("bench", ["--json"])]
    text = "## `surgery bench MODEL_DIR`\n`--against X` only\n## Environment\n"
    key, section = section_of("bench", sections(text)) or ("", "")
    assert key == "bench" and COMMANDS["bench"].visible - set(OPTION.findall(section))
    assert section_of("experts show", sections("## `surgery experts build M`\ntext\n"))[0] == "experts build"


def test_docs_cli_md_lists_every_registered_runtime() -> None:
    # surgery's own runtimes, from its distribution's entry points: not the registry, where another test of the
    # same process may have registered a third party's.
    own = [ep.name for ep in importlib.metadata.distribution("encoder-surgery").entry_points
           if ep.group == "surgery.runtimes"]
    assert own, "encoder-surgery registers no runtime: is it installed (pip install -e .)?"
    runtimes = sections_by_title(CLI_DOC.read_text()).get("Runtimes", "")
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", runtimes, flags=re.M))
    for name in own:
        assert name in listed, (f"docs/cli.md's '## Runtimes' table has no row for the runtime {name!r}: add "
                                f"'| `{name}` | what it is | what it needs |' (see `surgery export M --out D "
                                "--runtime list`)")
    unknown = listed - set(own)
    assert not unknown, f"docs/cli.md's '## Runtimes' table names runtimes that are not registered: {sorted(unknown)}"


def sections_by_title(text: str) -> dict[str, str]:
    """Every ``## Title`` section of a Markdown text by its title."""
    return {part.split("\n", 1)[0][3:].strip(): part for part in re.split(r"^(?=## )", text, flags=re.M)
            if part.startswith("## ")}
