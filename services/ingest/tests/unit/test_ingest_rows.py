"""Row-level validation: every row error code, schema detection, normalization, PII handling."""

import json

import pytest

from whetstone.ingest.domain.chat import check_messages
from whetstone.ingest.domain.issues import ERROR_CODES, WARNING_CODES, Issue, IssueLog
from whetstone.ingest.domain.rows import SchemaGate, apply_pii, map_contents, parse_json_line, role_counts
from whetstone.ingest.domain.schemas import (
    canonical_text, default_purpose, detect_schema, normalize_row, row_messages, validate_row,
)

pytestmark = pytest.mark.unit

U = {"role": "user", "content": "hi"}
A = {"role": "assistant", "content": "hello"}
S = {"role": "system", "content": "be nice"}


def codes(issues: list[Issue]) -> list[str]:
    return [i.code for i in issues]


@pytest.mark.parametrize("raw, code", [
    (b"\xef\xbb\xbf{\"messages\": []}", "bom"),
    (b"{\"messages\": \"\xff\xfe\"}", "bad_encoding"),
    (b"{\"messages\": [", "invalid_json"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid_json"),
    (b"[1, 2]", "row_not_object"),
    (b"\"just a string\"", "row_not_object"),
])
def test_line_parsing_errors(raw, code):
    row, issue = parse_json_line(raw, 7)
    assert row is None and issue.code == code and issue.line == 7


def test_valid_line_parses():
    row, issue = parse_json_line(json.dumps({"messages": [U, A]}).encode(), 1)
    assert issue is None and row == {"messages": [U, A]}


@pytest.mark.parametrize("messages, expected", [
    ("not a list", ["messages_not_list"]),
    ([], ["messages_not_list"]),
    ([U, "oops"], ["message_not_object", "no_assistant"]),
    ([U, {"role": "assistant", "content": "x", "extra": 1}], ["unknown_key"]),
    ([{"content": "x"}, A], ["missing_key", "role_order"]),
    ([U, {"role": "assistant"}], ["missing_key"]),
    ([{"role": "tool", "content": "x"}, U, A], ["unknown_role"]),
    ([U, {"role": "assistant", "content": 5}], ["content_not_string"]),
    ([U, {"role": "assistant", "content": "   "}], ["empty_content"]),
    ([U, {"role": "user", "content": "again"}], ["no_assistant"]),
    ([U, A, S, U, A], ["role_order"]),
    ([A, U, A], ["role_order"]),
    ([U, A, A], ["role_order"]),
    ([U, {**A, "weight": 2}], ["bad_weight"]),
    ([U, {**A, "weight": True}], ["bad_weight"]),
    ([U, {**A, "weight": 0}], ["nothing_to_train"]),
])
def test_chat_message_errors(messages, expected):
    assert codes(check_messages(messages, 3)) == expected


def test_every_problem_of_a_row_is_reported_not_just_the_first():
    issues = check_messages([A, {"role": "bot", "content": ""}, {"role": "assistant", "content": 1, "weight": 5}], 9)
    assert {"role_order", "unknown_role", "empty_content", "content_not_string", "bad_weight"} <= set(codes(issues))
    assert all(i.line == 9 for i in issues)


def test_valid_chat_with_weights_and_system():
    assert check_messages([S, U, {**A, "weight": 0}, U, {**A, "weight": 1}], 1) == []
    assert check_messages([U, {**A, "weight": 0}, {"role": "user", "content": "x", "weight": 1}, A], 1) == []


@pytest.mark.parametrize("row, schema", [
    ({"messages": [U, A]}, "chat"),
    ({"prompt": "p", "completion": "c"}, "prompt_completion"),
    ({"instruction": "i", "input": "", "output": "o"}, "instruction"),
    ({"prompt": "p", "chosen": "a", "rejected": "b"}, "preference"),
    ({"text": "plain text"}, "text"),
    ({"foo": 1}, None),
])
def test_schema_detection(row, schema):
    assert detect_schema(row) == schema


@pytest.mark.parametrize("row, schema, expected", [
    ({"prompt": "p"}, "prompt_completion", ["missing_key"]),
    ({"prompt": "p", "completion": "c", "x": 1}, "prompt_completion", ["unknown_key"]),
    ({"prompt": 3, "completion": "c"}, "prompt_completion", ["field_not_string"]),
    ({"prompt": "p", "completion": ""}, "prompt_completion", ["empty_field"]),
    ({"instruction": "i", "output": "o", "input": None}, "instruction", ["field_not_string"]),
    ({"text": ""}, "text", ["empty_field"]),
    ({"prompt": "p", "chosen": "same", "rejected": "same"}, "preference", ["chosen_equals_rejected"]),
    ({"chosen": "a", "rejected": "b"}, "preference", ["missing_key"]),
    ({"prompt": "p", "chosen": [U], "rejected": [A]}, "preference", ["no_assistant"]),
    ({"prompt": "p", "chosen": [A, A], "rejected": [A]}, "preference", ["role_order"]),
    ({"prompt": [U, A], "chosen": "a", "rejected": "b"}, "preference", []),
    ({"prompt": "p", "chosen": "a"}, "preference", ["missing_key"]),
])
def test_other_schema_errors(row, schema, expected):
    assert codes(validate_row(row, schema, 1)) == expected


def test_normalized_rows():
    assert normalize_row({"prompt": "p", "completion": "c"}, "prompt_completion") == {
        "messages": [{"role": "user", "content": "p"}, {"role": "assistant", "content": "c"}]}
    assert normalize_row({"instruction": "Do", "input": "this", "output": "ok"}, "instruction")["messages"][0] == \
        {"role": "user", "content": "Do\n\nthis"}
    assert normalize_row({"instruction": "Do", "input": "", "output": "ok"}, "instruction")["messages"][0][
        "content"] == "Do"
    pref = normalize_row({"prompt": "q", "chosen": "a", "rejected": "b"}, "preference")
    assert pref == {"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
                    "rejected": [{"role": "assistant", "content": "b"}]}
    implicit = normalize_row({"chosen": [U, A], "rejected": [U, {"role": "assistant", "content": "no"}]}, "preference")
    assert implicit["prompt"] == [U] and implicit["chosen"] == [A]
    assert normalize_row({"text": "t"}, "text") == {"text": "t"}
    assert default_purpose("preference") == "dpo" and default_purpose("text") == "cpt"
    assert default_purpose("chat") == "sft"


def test_implicit_preference_without_shared_prompt_is_missing_a_prompt():
    row = {"chosen": [U, A], "rejected": [{"role": "user", "content": "other"}, A]}
    assert codes(validate_row(row, "preference", 1)) == ["missing_key"]


def test_schema_gate_fixes_the_schema_and_rejects_mixed_rows():
    gate = SchemaGate()
    assert gate.check({"messages": [U, A]}, 1) == ("chat", [])
    assert gate.purpose == "sft"
    schema, issues = gate.check({"prompt": "p", "completion": "c"}, 2)
    assert codes(issues) == ["mixed_schema"] and "line 1" in issues[0].message
    _, issues = gate.check({"nothing": 1}, 3)
    assert codes(issues) == ["unknown_schema"]


def test_schema_gate_purpose_mismatch_is_one_file_level_error():
    gate = SchemaGate(purpose="dpo")
    gate.check({"messages": [U, A]}, 4)
    gate.check({"messages": [U, A]}, 5)
    assert codes(gate.file_issues) == ["schema_purpose_mismatch"] and gate.file_issues[0].line == 4
    assert "'sft'" in gate.file_issues[0].message


def test_text_and_roles_of_rows():
    pref = normalize_row({"prompt": "q", "chosen": "a", "rejected": "b"}, "preference")
    assert canonical_text(pref) == "q\na\nb"
    assert [m["role"] for m in row_messages(pref)] == ["user", "assistant", "assistant"]
    assert role_counts({"messages": [S, U, A, U, A]}) == {"system": 1, "user": 2, "assistant": 2}
    assert role_counts({"text": "x"}) == {"text": 1}
    assert map_contents({"text": "ab"}, str.upper) == {"text": "AB"}


def test_pii_redaction_keeps_weights_and_other_keys():
    out = {"messages": [U, {"role": "assistant", "content": "mail bob@example.com", "weight": 1}]}
    result = apply_pii(out, "redact")
    assert result.counts == {"email": 1}
    assert result.row["messages"][1] == {"role": "assistant", "content": "mail [EMAIL]", "weight": 1}
    assert apply_pii(out, "warn").row is out


def test_issue_log_counts_everything_and_keeps_a_capped_list():
    log = IssueLog(limit=3)
    for i in range(10):
        log.error("invalid_json", "bad", i + 1)
    log.warn("pii", "x", 2)
    assert log.error_count == 10 and len(log.errors) == 3 and log.error_counts == {"invalid_json": 10}
    assert [i.line for i in log.errors] == [1, 2, 3]
    assert log.warning_counts == {"pii": 1}
    with pytest.raises(AssertionError):
        log.error("not_a_code", "x")
    assert not set(ERROR_CODES) & set(WARNING_CODES)
