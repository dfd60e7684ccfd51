"""Config text: YAML/JSON parsing, syntax errors with line and column, file loading."""

from __future__ import annotations

import json

import pytest

from catalog.config import ConfigError, load_file, load_snapshot, parse_text
from tests.support.config_examples import example_document


def test_yaml_mapping_parses_to_a_dict():
    assert parse_text("a: 1\nb: [x, y]\n") == {"a": 1, "b": ["x", "y"]}


def test_json_is_accepted_as_yaml():
    document = example_document()
    assert parse_text(json.dumps(document)) == document


def test_bytes_are_decoded_as_utf8():
    assert parse_text("edge: {id: é}".encode()) == {"edge": {"id": "é"}}


def test_non_utf8_bytes_are_a_config_error():
    with pytest.raises(ConfigError) as caught:
        parse_text(b"edge: \xff\xfe")
    assert caught.value.issues[0].path == "<root>"
    assert "UTF-8" in caught.value.issues[0].message


def test_syntax_error_names_line_and_column():
    with pytest.raises(ConfigError) as caught:
        parse_text("edge:\n  id: a\n  listen: [unclosed\n")
    (issue,) = caught.value.issues
    assert issue.path == "<root>"
    assert "line 4" in issue.message and "column" in issue.message


def test_duplicate_key_is_a_syntax_error_at_its_line():
    with pytest.raises(ConfigError) as caught:
        parse_text("edge:\n  id: a\n  id: b\n")
    (issue,) = caught.value.issues
    assert "duplicate key 'id'" in issue.message
    assert "line 3, column 3" in issue.message


@pytest.mark.parametrize("text", ["", "   \n", "# only a comment\n", "---\n"])
def test_empty_document_is_rejected(text):
    with pytest.raises(ConfigError, match="empty"):
        parse_text(text)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_non_mapping_root_is_rejected(text):
    with pytest.raises(ConfigError) as caught:
        parse_text(text)
    assert caught.value.issues[0].path == "<root>"
    assert "mapping" in caught.value.issues[0].message


def test_two_documents_in_one_stream_are_rejected():
    with pytest.raises(ConfigError, match="single document"):
        parse_text("a: 1\n---\nb: 2\n")


def test_load_snapshot_rejects_a_non_mapping_root():
    with pytest.raises(ConfigError, match="<root>: "):
        load_snapshot(["not", "a", "mapping"])  # type: ignore[arg-type]


def test_load_file_reads_yaml_and_json(tmp_path):
    document = example_document()
    as_json = tmp_path / "edge.json"
    as_json.write_text(json.dumps(document))
    from_json = load_file(as_json)
    assert from_json == load_snapshot(document)
    assert load_file(str(as_json)).edge_id == "edge-test"


def test_load_file_of_a_missing_path_is_a_config_error(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as caught:
        load_file(missing)
    assert caught.value.issues[0].path == "<root>"
    assert "cannot read" in caught.value.issues[0].message


def test_yaml_merge_keys_may_be_overridden_without_a_duplicate_error():
    text = "base: &b {capacity: 1, priority: 5}\nprovider:\n  <<: *b\n  capacity: 4\n"
    assert parse_text(text)["provider"] == {"capacity": 4, "priority": 5}
