"""Every code example of README.md and docs/*.md is run or checked, so the docs cannot drift from the code.

Each fenced block is judged by its language:

- ``python``: a block that builds a DAG is loaded through Airflow's DagBag from a file of its own (no import
  error, at least one DAG, Airflow's own DAG checks); any other block is executed as written.
- ``yaml``: a ``craft-connector.yml`` (or one profile of its ``Engine`` section, indented as in the file)
  is resolved by the provider's profile loader, with every variable it names set to a made-up value.
- ``json``: an Airflow connection is resolved by the provider, as a worker resolves it.
- ``bash`` / ``console``: each command is checked: ``etl-craft-airflow`` command lines parse with the CLI's
  own parser, ``export AIRFLOW_CONN_…`` connections resolve, ``make`` targets exist in the Makefile and
  ``python <script>`` / ``python -m <module>`` name files of the repository. In ``console`` blocks only the
  ``$`` lines are commands; the rest is output.
- ``text`` and ``mermaid`` are output samples, file trees and diagrams: never run.

A block that cannot run here is marked by an HTML comment on the line before its fence: ``<!-- not-run:
why -->``, or ``<!-- run-by: tests/….py -->`` when another test runs it (that test must name the page). An
unmarked block of any other language, or a command of none of the kinds above, fails this test.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from airflow.models.connection import Connection

from airflow_provider_etl_craft.cli.main import build_parser
from airflow_provider_etl_craft.config import load_engine_profile
from airflow_provider_etl_craft.config.connection import profile_from_connection
from tests.fixtures.fix_airflow import dag_bag_class

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Fence languages that are never run: output samples, file trees, diagrams.
NOT_RUN_LANGUAGES = {"text", "mermaid"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[^\s`]*)[^\n]*$")
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>not-run|run-by):\s*(?P<what>.*?)\s*-->\s*$")
#: A value in a craft-connector.yml that names a variable (etl-craft's rule: the whole text).
VARIABLE = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its text, and the marker comment before it."""

    page: str
    line: int
    lang: str
    code: str
    marker: tuple[str, str] | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ```{self.lang}"


def collect(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, indentation of list items removed."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent = opening["indent"]
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        code = "\n".join(
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]
        )
        before = MARKER.match(lines[i - 1]) if i > 0 else None
        marker = (before["kind"], before["what"]) if before else None
        blocks.append(Block(str(page.relative_to(ROOT)), i + 1, opening["lang"], code + "\n", marker))
        i = end + 1
    return blocks


BLOCKS = [block for page in PAGES for block in collect(page)]


def run_python(block: Block, tmp_path: Path) -> None:
    if "DAG(" in block.code:
        folder = tmp_path / "dags"
        folder.mkdir()
        (folder / "docs_example.py").write_text(block.code, encoding="utf-8")
        bag = dag_bag_class()(dag_folder=str(folder))
        assert not bag.import_errors, f"{block}: {bag.import_errors}"
        assert bag.dag_ids, f"{block}: the example builds no DAG"
        return
    exec(compile(block.code, str(block), "exec"), {"__name__": "docs_example"})  # noqa: S102


def set_variables(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A made-up value for every variable the file names, in the environment and as an Airflow Variable."""
    for value in re.findall(r":\s*([A-Z][A-Z0-9_]*)\s*(?:#.*)?$", text, re.M):
        if VARIABLE.match(value):
            monkeypatch.setenv(value, f"docs-{value.lower()}")
            monkeypatch.setenv(f"AIRFLOW_VAR_{value}", f"docs-{value.lower()}")


def run_yaml(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = block.code
    if not re.search(r"^Engine:", text, re.M):  # one profile of the Engine section, as the page shows it
        assert text.startswith("  ") and re.match(r"^  \w+:\n", text), (
            f"{block}: neither a file nor a profile"
        )
        text = f"Secrets:\n  Source_type: environment\nEngine:\n{text}"
    set_variables(text, monkeypatch)
    monkeypatch.delenv("ETL_CRAFT_PROFILE", raising=False)
    path = tmp_path / "craft-connector.yml"
    path.write_text(text, encoding="utf-8")
    profile = load_engine_profile(path)
    assert profile is not None, block


def check_connection(conn: Connection, block: Block) -> None:
    if conn.conn_type == "etl_craft" and (conn.extra_dejson or {}).get("config_path"):
        # A file-backed connection names a file on the workers: only its two extras are checked here.
        assert set(conn.extra_dejson) <= {"config_path", "profile"}, block
        return
    assert profile_from_connection(conn) is not None, block


def run_json(block: Block) -> None:
    check_connection(Connection.from_json(block.code, conn_id="docs_example"), block)


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w-]*):(?!=)", text, re.M))


def check_command(argv: list[str], block: Block, monkeypatch: pytest.MonkeyPatch) -> None:
    """One command line of a bash or console block."""
    assert argv, block
    if argv[0] == "etl-craft-airflow":
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit as exit_:
            raise AssertionError(f"{block}: {shlex.join(argv)} does not parse ({exit_.code})") from exit_
    elif argv[0] == "export" and argv[1].startswith("AIRFLOW_CONN_"):
        name, _, value = argv[1].partition("=")
        conn_id = name.removeprefix("AIRFLOW_CONN_").lower()
        monkeypatch.setenv(name, value)  # a postgres connection is read back by its id
        check_connection(Connection.from_json(value, conn_id=conn_id), block)
    elif argv[0] == "make":
        targets = [a for a in argv[1:] if "=" not in a and not a.startswith("-")]
        assert targets and set(targets) <= makefile_targets(), f"{block}: {shlex.join(argv)}: no such target"
    elif argv[0] == "python" and argv[1] == "-m":
        module = ROOT.joinpath(*argv[2].split("."))
        assert module.with_suffix(".py").is_file() or (module / "__main__.py").is_file(), block
    elif argv[0] == "python":
        assert (ROOT / argv[1]).is_file(), f"{block}: no {argv[1]}"
    else:
        raise AssertionError(
            f"{block}: {shlex.join(argv)}: not a command this test can check; mark the block"
        )


def commands(block: Block) -> list[list[str]]:
    """The command lines of a bash block (every line) or a console block (``$`` lines and their continuations);
    a command runs on over lines that end in a backslash or sit inside an open quote."""
    found: list[list[str]] = []
    pending: str | None = None
    for line in block.code.splitlines():
        if pending is None:
            if block.lang == "console" and not line.startswith("$ "):
                continue  # output
            pending = line[2:] if block.lang == "console" else line
        else:
            pending += "\n" + line
        if pending.endswith("\\"):
            continue
        try:
            argv = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        if argv:
            found.append(argv)
        pending = None
    assert pending is None, f"{block}: an unfinished command: {pending!r}"
    return found


def run_shell(block: Block, monkeypatch: pytest.MonkeyPatch) -> None:
    found = commands(block)
    assert found, f"{block}: no command"
    for argv in found:
        check_command(argv, block, monkeypatch)


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_every_code_example_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if block.marker is not None:
        kind, what = block.marker
        assert what, f"{block}: a {kind} marker says why"
        if kind == "run-by":
            test_file = ROOT / what.split()[0]
            assert test_file.is_file(), f"{block}: no {test_file}"
            assert block.page in test_file.read_text(encoding="utf-8"), (
                f"{block}: {what} does not read this page"
            )
        return
    if block.lang in NOT_RUN_LANGUAGES:
        return
    monkeypatch.chdir(tmp_path)
    if block.lang == "python":
        run_python(block, tmp_path)
    elif block.lang == "yaml":
        run_yaml(block, tmp_path, monkeypatch)
    elif block.lang == "json":
        run_json(block)
    elif block.lang in ("bash", "console"):
        run_shell(block, monkeypatch)
    else:
        pytest.fail(
            f"{block}: no way to run a ```{block.lang or '(no language)'} block; mark it or label it text"
        )


def test_the_examples_are_found() -> None:
    """The collector sees the pages' blocks (a parse slip would make the test above pass on nothing)."""
    languages = {block.lang for block in BLOCKS}
    assert {"python", "yaml", "json", "bash", "console", "text"} <= languages
    assert any(block.page == "README.md" and block.lang == "python" for block in BLOCKS)


# -- the README's links into docs/ work on GitHub ----------------------------------------------------------


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {github_anchor(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_the_readme_links_into_docs_resolve() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert links
    for target, anchor in links:
        path = ROOT / target
        assert path.is_file(), target
        if anchor:
            assert anchor in anchors(path), f"README links to {target}#{anchor}: no such heading"
