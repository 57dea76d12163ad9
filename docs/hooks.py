"""The documentation's generated parts, made from the code when the site is built (a MkDocs hook), so they
cannot drift from it: the settings table (from the declarations in `proxy/config.py`), each command's
`--help` (from `proxy/cli.py`), and the detection log's schema (from the models in `proxy/store/models.py`).

A page asks for a part with a marker on a line of its own: `<!-- settings -->`, `<!-- help: COMMAND -->`
(`<!-- help -->` for the program's own), `<!-- schema -->`. A marker naming something the code does not have
fails the build.
"""

from __future__ import annotations

import re

MARKER = re.compile(r"^<!-- (settings|schema|help(?:: ([a-z-]+))?) -->$", re.M)


def settings_table() -> str:
    """Every setting: its variable, flag, default and meaning."""
    from proxy.config import ENV_PREFIX, FIELDS, flag_name, shown_default

    rows = ["| variable | flag | default | meaning |", "|---|---|---|---|"]
    for name, declared in FIELDS.items():
        meaning = declared.metadata["help"]
        if declared.metadata["choices"]:
            meaning += f" (one of {', '.join(f'`{choice}`' for choice in declared.metadata['choices'])})"
        default = shown_default(name)
        rows.append(f"| `{ENV_PREFIX}{name.upper()}` | `{flag_name(name)}` | "
                    f"{'unset' if default is None else f'`{default}`'} | {_cell(meaning)} |")
    return "\n".join(rows)


def command_help(command: str | None) -> str:
    from proxy.cli import command_help as help_text

    return f"```text\n{help_text(command).rstrip()}\n```"


def schema() -> str:
    """Each table of the log: its columns, their types, and which may be empty."""
    from proxy.store.models import Base

    parts = []
    for table in Base.metadata.sorted_tables:
        model = next(mapper.class_ for mapper in Base.registry.mappers if mapper.local_table is table)
        doc = " ".join((model.__doc__ or "").split())
        parts += [f"### `{table.name}`", "", doc, "", "| column | type | empty allowed | key |", "|---|---|---|---|"]
        parts += [f"| `{column.name}` | {_cell(str(column.type))} | {'yes' if column.nullable else 'no'} | "
                  f"{'primary' if column.primary_key else ''} |" for column in table.columns]
        parts.append("")
    return "\n".join(parts)


def render(markdown: str) -> str:
    """A page's markdown with each marker replaced by the part it names."""

    def part(found: re.Match) -> str:
        if found.group(1) == "settings":
            return settings_table()
        if found.group(1) == "schema":
            return schema()
        return command_help(found.group(2))

    return MARKER.sub(part, markdown)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def on_page_markdown(markdown: str, page, config, files) -> str:  # the MkDocs hook
    return render(markdown)
