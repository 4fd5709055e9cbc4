"""craft-connector.yml is read by libyaml where it can and by PyYAML's Python parser otherwise
(``config/load.py``): both must give the same document, and every refusal must carry the Python parser's
message, whichever parser met the problem first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_provider_etl_craft.config import load
from airflow_provider_etl_craft.errors import ConfigurationError
from tests.unit.test_config_corpus import CORPUS

VALID = {
    "anchors-and-merges": (
        "Engine:\n  Profile: dev\n  base: &base\n    schema: etl_craft\n    auth_mode: password\n"
        "  dev:\n    <<: *base\n    jdbc_url: jdbc:postgresql://db:5432/x\n"
    ),
    "quoting-and-folding": (
        "Engine:\n  dev:\n    jdbc_url: 'jdbc:sqlite:/tmp/a b.db'\n    schema: \"main\"\n"
        "    note: >\n      folded\n      text\n    other: |\n      kept\n      lines\n"
    ),
    "unicode-and-numbers": "Engine:\n  dév:\n    port: 5432\n    ratio: 1.5\n    on: yes\n    when: 2026-01-01\n",
    "flow-style": "Engine: {dev: {jdbc_url: 'jdbc:sqlite:x.db', schema: main}, Profile: dev}\n",
    "comments-and-documents": "# head\n---\nEngine:\n  dev:   # trailing\n    schema: main\n...\n",
}


def _python_parser(text: str) -> Any:
    return yaml.load(text, Loader=load._StrictLoader)  # noqa: S506 - a SafeLoader


def _outcome(parse: Any, text: str) -> tuple[str, Any]:
    try:
        return "document", parse(text)
    except Exception as exc:  # noqa: BLE001 - compared, whatever it is
        return type(exc).__name__, str(exc)


def test_libyaml_is_there_and_reads_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The installed PyYAML has libyaml (the pinned wheels do), and a valid file never reaches the Python parser."""
    assert load._FastStrictLoader is not None

    class Refuses(load._StrictLoader):
        def __init__(self, stream: str) -> None:
            raise AssertionError("the Python parser read a valid file")

    monkeypatch.setattr(load, "_StrictLoader", Refuses)
    path = tmp_path / "craft-connector.yml"
    path.write_text(VALID["anchors-and-merges"], encoding="utf-8")
    assert load.load_connector_file(path).engine["dev"]["schema"] == "etl_craft"


@pytest.mark.parametrize("text", list(VALID.values()), ids=list(VALID))
def test_both_parsers_give_the_same_document(text: str) -> None:
    fast = yaml.load(text, Loader=load._FastStrictLoader)  # noqa: S506 - a SafeLoader
    assert fast == _python_parser(text)
    assert load._parse(text) == fast


@pytest.mark.parametrize(
    "text",
    [
        "Engine:\n  dev:\n    schema: a\n    schema: b\n",  # a duplicate key (the provider's own rule)
        "Engine:\n  dev:\n    <<: {schema: a}\n    schema: b\n",  # a duplicate a merge brings
        "Engine:\n  ? [a, b]\n  : x\n",  # a key that is a list
        "Engine:\n  dev: [\n",  # unterminated flow sequence
        "Engine:\n\tdev: x\n",  # a tab where indentation is expected
        "Engine: !!python/object:os.system x\n",  # a tag a SafeLoader refuses
        "Engine:\n  dev: *nowhere\n",  # an undefined alias
        "Engine:\n  dev: x\n # \x00\n",  # NUL: the Python reader's refusal
        "Engine:\n  dev: 'x\n",  # an unterminated quote
    ],
)
def test_a_refusal_is_the_python_parsers(text: str) -> None:
    """Whatever libyaml says, the error (type and message) is the one the Python parser gives."""
    expected = _outcome(_python_parser, text)
    assert expected[0] != "document"
    assert _outcome(load._parse, text) == expected


@pytest.mark.parametrize("text", [pytest.param(case.values[0], id=case.id) for case in CORPUS])
def test_the_malformed_config_corpus_parses_alike(text: str) -> None:
    """Every text of the malformed-config corpus: the same document or the same refusal as the Python parser."""
    assert _outcome(load._parse, text) == _outcome(_python_parser, text)


def test_a_refusal_reaches_the_user_with_the_python_parsers_position(tmp_path: Path) -> None:
    path = tmp_path / "craft-connector.yml"
    path.write_text("Engine:\n  dev:\n    schema: a\n    schema: b\n", encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"key 'schema' appears twice \(lines 3 and 4"):
        load.load_connector_file(path)
