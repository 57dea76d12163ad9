"""The documentation against the code: the configuration page lists exactly the settings the code declares,
each CLI page is its command's current `--help`, the README's relative links resolve, and its Quickstart keeps
its two commands. (`make docs-build` builds the whole site strictly; these need no MkDocs.)"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from proxy.cli import command_help, commands
from proxy.config import ENV_PREFIX, FIELDS, flag_name, shown_default

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rendered(page: str) -> str:
    """A page as the site shows it: its generated parts made."""
    return _hooks().render((DOCS / page).read_text())


def test_the_configuration_page_lists_exactly_the_settings_the_code_declares():
    page = rendered("configuration.md")
    rows = [line for line in page.splitlines() if line.startswith(f"| `{ENV_PREFIX}")]
    listed = {re.match(rf"\| `{ENV_PREFIX}(\w+)`", row).group(1).lower(): row for row in rows}
    assert list(listed) == list(FIELDS)  # each once, in the order declared
    for name, row in listed.items():
        declared = FIELDS[name].metadata
        default = shown_default(name)
        assert f"| `{flag_name(name)}` |" in row, row
        assert (f"| `{default}` |" if default is not None else "| unset |") in row, row
        assert declared["help"].replace("|", "\\|") in row, row
    assert "<!--" not in page


def test_each_cli_page_is_its_commands_current_help():
    pages = {path.stem for path in (DOCS / "cli").glob("*.md")} - {"index"}
    assert pages == set(commands())  # a page for each command, none for a command that is gone
    for command in commands():
        page = rendered(f"cli/{command}.md")
        assert f"```text\n{command_help(command).rstrip()}\n```" in page, command
        assert f"usage: loopwarden {command}" in page
    assert command_help().rstrip() in rendered("cli/index.md")


def test_the_log_schema_page_names_every_column():
    from proxy.store.models import Base

    page = rendered("detection-log.md")
    for table in Base.metadata.sorted_tables:
        assert f"### `{table.name}`" in page
        for column in table.columns:
            assert f"| `{column.name}` |" in page, (table.name, column.name)


def test_every_page_is_in_the_navigation():
    """Strict builds fail on a page left out; this says which, without MkDocs."""
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")}
    assert {page for page in pages if page not in nav} == set()


def test_the_readmes_relative_links_resolve():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    relative = [link for link in links if not re.match(r"[a-z]+:", link) and not link.startswith("#")]
    assert len(relative) > 10
    missing = [link for link in relative if not (ROOT / link.split("#")[0]).exists()]
    assert missing == []


def test_the_quickstart_keeps_exactly_two_commands():
    readme = (ROOT / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    first_block = quickstart.split("```sh\n", 1)[1].split("```", 1)[0]
    commands_given = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands_given == ["make serve", "make test"]
    assert len(readme.splitlines()) <= 170
