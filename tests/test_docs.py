"""The project's own docs (docs/, built by `make docs`) stay true to the code.

1. The configuration reference lists every variable `config/settings.py` reads through
   its env helpers, and nothing it does not read.
2. Variables read elsewhere (the Procfile, `os.environ` in the packages) are listed too.
3. Every alert rule of deploy/prometheus/alerts.yml has a runbook section.
4. Every `docs/<page>.md#<anchor>` cited anywhere in the repository names a page and a
   heading that exist, so that a comment's pointer never dangles.
5. docs/architecture.md's dispatcher table names every step the dispatcher runs, in
   order, with its module; its actor table every `actor_type` the audit column holds.

`make test` also builds the site with `mkdocs build --strict`, which checks the links
between the pages themselves.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import markdown
import yaml

from tests.processes import ROOT

SETTINGS = ROOT / "config" / "settings.py"
REFERENCE = ROOT / "docs" / "configuration.md"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
RUNBOOKS = ROOT / "docs" / "operations" / "alerts.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
ENV_HELPERS = frozenset(
    {
        "env_str",
        "env_int",
        "env_bool",
        "env_float",
        "env_json",
        "env_list",
        "env_duration",
        "env_durations",
    }
)
PACKAGES = ("config", "core", "audit", "jobs", "dlq")
# A table row whose first cell names variables: | `NAME` | or | `A`, `B` |.
_ROW = re.compile(r"^\|\s*((?:`[A-Z][A-Z0-9_]*`(?:,\s*)?)+)\s*\|")
_NAME = re.compile(r"`([A-Z][A-Z0-9_]*)`")
_ENVIRON_GET = re.compile(r"os\.environ\.get\(\s*\"([A-Z][A-Z0-9_]*)\"")
_CITATION = re.compile(r"(?<![\w/.-])docs/([\w/.-]+?\.md)(?:#([\w-]+))?")


def settings_env_reads(source: str) -> set[str]:
    """Names passed to the env helpers (env_str("NAME", ...), ...) in settings source."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ENV_HELPERS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names


def documented(text: str, section: str) -> set[str]:
    """Variable names in the first column of the tables under the `## section` heading."""
    names: set[str] = set()
    inside = False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line[3:].strip() == section
            continue
        match = _ROW.match(line) if inside else None
        if match:
            names.update(_NAME.findall(match.group(1)))
    return names


def other_env_reads() -> set[str]:
    """`os.environ.get("NAME")` in the packages, and `${NAME:-...}` in the Procfile."""
    names = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):-", (ROOT / "Procfile").read_text()))
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts or path == SETTINGS:
                continue
            names.update(_ENVIRON_GET.findall(path.read_text()))
    return names


def page_anchors(page: Path) -> set[str]:
    """The ids MkDocs gives the page's headings (Python-Markdown's toc, as mkdocs.yml)."""
    md = markdown.Markdown(extensions=["toc", "attr_list", "tables"])
    md.convert(page.read_text())
    anchors: set[str] = set()
    todo = list(md.toc_tokens)  # type: ignore[attr-defined]
    while todo:
        token = todo.pop()
        anchors.add(token["id"])
        todo += token["children"]
    return anchors


def citations(text: str) -> list[tuple[str, str | None]]:
    return [(page, anchor or None) for page, anchor in _CITATION.findall(text)]


def test_it_documents_every_setting_read_from_the_environment():
    missing = settings_env_reads(SETTINGS.read_text()) - documented(
        REFERENCE.read_text(), "Environment variables"
    )
    assert missing == set(), f"add to docs/configuration.md: {sorted(missing)}"


def test_it_documents_no_setting_that_settings_does_not_read():
    extra = documented(REFERENCE.read_text(), "Environment variables") - settings_env_reads(
        SETTINGS.read_text()
    )
    assert extra == set(), f"not read by config/settings.py: {sorted(extra)}"


def test_it_documents_the_variables_read_outside_settings():
    missing = other_env_reads() - documented(REFERENCE.read_text(), "Variables read elsewhere")
    assert missing == set(), f"add to docs/configuration.md: {sorted(missing)}"


def test_the_settings_scan_sees_each_env_helper_and_the_reference_scan_each_row():
    source = 'A = env_int("JOBOPS_A", 1)\nB = env_json("JOBOPS_B", {})\nC = os.environ["NOT_ME"]\n'
    assert settings_env_reads(source) == {"JOBOPS_A", "JOBOPS_B"}
    page = (
        "## Environment variables\n\n| variable | default |\n| --- | --- |\n"
        "| `JOBOPS_A` | `1` |\n| `X_1`, `X_2` | |\n\n## Other\n\n| `JOBOPS_B` | |\n"
    )
    assert documented(page, "Environment variables") == {"JOBOPS_A", "X_1", "X_2"}


def test_it_gives_every_alert_rule_a_runbook_section():
    rules = yaml.safe_load(ALERTS.read_text())["groups"]
    alerts = {rule["alert"] for group in rules for rule in group["rules"]}
    sections = {line[3:].strip() for line in RUNBOOKS.read_text().splitlines() if line[:3] == "## "}
    assert alerts, "no alert rules found"
    assert alerts - sections == set(), "add a section to docs/operations/alerts.md"


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the table whose header line starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_the_dispatcher_table_names_every_step_in_order_with_its_module():
    from django.conf import settings

    rows = table_rows(ARCHITECTURE.read_text(), "| step | what it does | module |")
    documented = [(row[0].strip("`"), row[-1].strip("`")) for row in rows]
    steps = [(name, path.rsplit(".", 1)[0]) for name, path in settings.JOBOPS_DISPATCHER_STEPS]
    assert documented == steps


def test_the_actor_table_names_every_actor_type():
    from audit.models import ActorType

    rows = table_rows(ARCHITECTURE.read_text(), "| `actor_type` | written when |")
    assert [row[0].strip("`") for row in rows] == list(ActorType.values)


def test_every_docs_citation_in_the_repository_names_a_page_and_heading_that_exist():
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    anchors: dict[str, set[str]] = {}
    broken = []
    for name in filter(None, (t.decode() for t in tracked)):
        path = ROOT / name
        if not path.is_file():
            continue  # deleted in the work tree, not yet committed
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for page, anchor in citations(text):
            target = ROOT / "docs" / page
            if not target.is_file():
                broken.append(f"{name}: docs/{page} does not exist")
                continue
            if anchor is None:
                continue
            if page not in anchors:
                anchors[page] = page_anchors(target)
            if anchor not in anchors[page]:
                broken.append(f"{name}: docs/{page} has no heading #{anchor}")
    assert broken == []


def test_the_citation_scan_sees_a_page_and_its_anchor(tmp_path):
    assert citations("see docs/architecture.md#claim-heartbeat-reaper, and docs/api.md.") == [
        ("architecture.md", "claim-heartbeat-reaper"),
        ("api.md", None),
    ]
    assert citations("mkdocs/x.md and site/docs/y.md") == []
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Claim, heartbeat, reaper\n\n### Roles\n")
    assert page_anchors(page) == {"title", "claim-heartbeat-reaper", "roles"}
