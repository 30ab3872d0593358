"""Row-level validation: every row error code, schema detection, normalization, PII handling."""

import json

import pytest

from whetstone.ingest.domain.chat import check_messages
from whetstone.ingest.domain.issues import ERROR_CODES, WARNING_CODES, Issue, IssueLog
from whetstone.ingest.domain.layouts import LAYOUTS, RowFacts, choose, key_issues
from whetstone.ingest.domain.normal import ChatRow, PreferenceRow, TextRow
from whetstone.ingest.domain.rows import LayoutGate, apply_pii, map_contents, parse_json_line, role_counts
from whetstone.ingest.domain.schemas import canonical_text, default_purpose, normalize_preference, row_messages
from whetstone.ingest.domain.suggest import closest, edit_distance

pytestmark = pytest.mark.unit

U = {"role": "user", "content": "hi"}
A = {"role": "assistant", "content": "hello"}
S = {"role": "system", "content": "be nice"}


def codes(issues: list[Issue]) -> list[str]:
    return [i.code for i in issues]


@pytest.mark.parametrize("raw, code", [
    (b"\xef\xbb\xbf{\"messages\": []}", "bom"),
    (b'{"messages": NaN}', "invalid_number"),
    (b'{"a": -Infinity}', "invalid_number"),
    (b'{"messages": "a\x00b"}', "binary_content"),
    (b'{"m": "\x00\xff\xfe"}', "binary_content"),
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
    ([U, {"role": "assistant", "content": "x", "contnet": 1}], ["unknown_key"]),
    ([{"content": "x"}, A], ["missing_key", "role_order"]),
    ([U, {"role": "assistant"}], ["missing_key"]),
    ([{"role": "robot", "content": "x"}, U, A], ["unknown_role"]),
    ([{"role": "asistant", "content": "x"}, U, A], ["unknown_role"]),
    ([U, {"role": "assitant", "content": "x"}], ["unknown_role"]),   # not also "no assistant turn"
    ([{"role": "tool", "content": "x"}, U, A], ["role_order"]),
    ([U, {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     ["content_part_unsupported"]),
    ([U, {"role": "assistant", "content": None}], ["content_not_string"]),
    ([U, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}],
     ["bad_tool_call"]),
    ([U, {"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}, A],
     ["bad_tool_call"]),
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


def test_content_parts_tools_and_tool_messages_are_valid():
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    parts = [{"type": "text", "text": "Weather"}, {"type": "text", "text": "Paris?"}]
    messages = [S, {"role": "user", "content": parts},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "18C"},
                {"role": "assistant", "content": "It is 18C.", "weight": 1, "name": "bot"}]
    assert check_messages(messages, 1) == []
    wrong_id = [U, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c9", "content": "x"}, A]
    assert codes(check_messages(wrong_id, 1)) == ["bad_tool_call"]


def read(row, purpose=None):
    gate = LayoutGate(purpose=purpose)
    got = gate.read(row, 1)
    return gate, got


@pytest.mark.parametrize("row, layout, schema", [
    ({"messages": [U, A]}, "openai_chat", "chat"),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}, "sharegpt", "chat"),
    ({"prompt": "p", "completion": "c"}, "prompt_completion", "prompt_completion"),
    ({"instruction": "i", "input": "", "output": "o"}, "alpaca", "instruction"),
    ({"prompt": "p", "chosen": "a", "rejected": "b"}, "trl_preference", "preference"),
    ({"input": {"messages": [U]}, "preferred_output": [A], "non_preferred_output": [{**A, "content": "no"}]},
     "openai_dpo", "preference"),
    ({"text": "plain text"}, "text", "text"),
])
def test_layout_detection(row, layout, schema):
    choice = choose(row, None, None)
    assert choice.layout.name == layout and choice.layout.schema == schema and not choice.alternatives
    gate, got = read(row)
    assert got.issues == [] and gate.layout_counts == {layout: 1}


def test_purpose_decides_between_layouts_that_both_fit():
    ultra = {"prompt": "q", "chosen": [{"role": "user", "content": "q"}, A],
             "rejected": [{"role": "user", "content": "q"}, {**A, "content": "no"}], "messages": [U, A],
             "prompt_id": "abc", "score_chosen": 8.0}
    assert choose(ultra, "dpo", None).layout.name == "trl_preference"
    assert choose(ultra, "sft", None).layout.name == "openai_chat"
    default = choose(ultra, None, None)
    assert default.layout.name == "openai_chat" and default.alternatives == ("trl_preference",)
    gate, got = read(ultra, "dpo")
    assert got.out == PreferenceRow(prompt=[{"role": "user", "content": "q"}], chosen=[A],
                                    rejected=[{**A, "content": "no"}])  # the sides no longer repeat the prompt
    assert gate.facts.ignored == {"messages": 1, "prompt_id": 1, "score_chosen": 1}


@pytest.mark.parametrize("row, expected", [
    ({"prompt": "p"}, ["missing_key"]),
    ({"prompt": "p", "complection": "c"}, ["unknown_key"]),
    ({"mesages": [U, A]}, ["unknown_key"]),
    ({"messages": [U, A], "id": 7, "source": "x"}, []),
    ({"foo": 1}, ["unknown_schema"]),
])
def test_unknown_keys_are_ignored_but_typos_are_errors(row, expected):
    _, got = read(row)
    assert codes(got.issues) == expected
    if expected == ["unknown_key"]:
        assert "did you mean" in got.issues[0].message


def test_suggestions():
    assert closest("mesages", ["messages", "text"]) == "messages" and closest("Messages", ["messages"]) == "messages"
    assert closest("prompt_id", ["prompt"]) is None and closest("id", ["text"]) is None
    assert closest("asistant", ["system", "user", "assistant"]) == "assistant"
    assert edit_distance("abcd", "abdc") == 1 and edit_distance("", "abc") == 3


@pytest.mark.parametrize("row, layout, expected", [
    ({"prompt": 3, "completion": "c"}, "prompt_completion", ["field_not_string"]),
    ({"prompt": "p", "completion": ""}, "prompt_completion", ["empty_field"]),
    ({"instruction": "i", "output": "o", "input": None}, "alpaca", ["field_not_string"]),
    ({"instruction": "i", "output": "o", "history": [["q"]]}, "alpaca", ["field_not_string"]),
    ({"text": ""}, "text", ["empty_field"]),
    ({"prompt": "p", "chosen": "same", "rejected": "same"}, "trl_preference", ["chosen_equals_rejected"]),
    ({"chosen": "a", "rejected": "b"}, "trl_preference", ["missing_key"]),
    ({"prompt": "p", "chosen": [U], "rejected": [A]}, "trl_preference", ["no_assistant"]),
    ({"prompt": "p", "chosen": [A, A], "rejected": [A]}, "trl_preference", ["role_order"]),
    ({"prompt": [U, A], "chosen": "a", "rejected": "b"}, "trl_preference", []),
    ({"conversations": [{"from": "humn", "value": "q"}]}, "sharegpt", ["unknown_role"]),
    ({"conversations": [{"from": "human", "value": "q"}]}, "sharegpt", ["no_assistant"]),
    ({"input": {"msgs": []}, "preferred_output": [A], "non_preferred_output": [A]}, "openai_dpo", ["missing_key"]),
    ({"input": {"messages": [U]}, "preferred_output": "a", "non_preferred_output": [A]}, "openai_dpo",
     ["messages_not_list"]),
])
def test_layout_errors(row, layout, expected):
    assert codes(LAYOUTS[layout].validate(row, 1, RowFacts())) == expected


def test_normalized_rows():
    def norm(row, layout):
        return LAYOUTS[layout].normalize(row).as_json()
    assert norm({"prompt": "p", "completion": "c"}, "prompt_completion") == {
        "messages": [{"role": "user", "content": "p"}, {"role": "assistant", "content": "c"}]}
    assert norm({"instruction": "Do", "input": "this", "output": "ok"}, "alpaca")["messages"][0] == \
        {"role": "user", "content": "Do\n\nthis"}
    alpaca = norm({"instruction": "Do", "input": "", "output": "ok", "system": "Be brief.", "history": [["hi", "hey"]]},
                  "alpaca")
    assert [m["role"] for m in alpaca["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    pref = norm({"prompt": "q", "chosen": "a", "rejected": "b"}, "trl_preference")
    assert pref == {"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
                    "rejected": [{"role": "assistant", "content": "b"}]}
    implicit = normalize_preference(None, [U, A], [U, {"role": "assistant", "content": "no"}])
    assert implicit.prompt == [U] and implicit.chosen == [A]
    assert norm({"text": "t"}, "text") == {"text": "t"}
    two = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    parts = norm({"messages": [{"role": "user", "content": two},
                               {"role": "developer", "content": "x"}]}, "openai_chat")
    assert parts["messages"] == [{"role": "user", "content": "a\nb"}, {"role": "system", "content": "x"}]
    plain = {"messages": [U, A]}
    assert norm(plain, "openai_chat")["messages"] is plain["messages"]  # nothing to change: the same list
    assert default_purpose("preference") == "dpo" and default_purpose("text") == "cpt"
    assert default_purpose("chat") == "sft"


def test_implicit_preference_without_shared_prompt_is_missing_a_prompt():
    row = {"chosen": [U, A], "rejected": [{"role": "user", "content": "other"}, A]}
    assert codes(LAYOUTS["trl_preference"].validate(row, 1, RowFacts())) == ["missing_key"]


def test_layout_gate_fixes_the_schema_and_rejects_mixed_rows():
    gate = LayoutGate()
    assert gate.read({"messages": [U, A]}, 1).issues == []
    assert gate.purpose == "sft"
    share = gate.read({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}, 2)
    assert share.issues == [] and share.out == ChatRow([{"role": "user", "content": "q"},
                                                         {"role": "assistant", "content": "a"}])
    issues = gate.read({"prompt": "p", "completion": "c"}, 3).issues
    assert codes(issues) == ["mixed_schema"] and "line 1" in issues[0].message
    assert codes(gate.read({"nothing": 1}, 4).issues) == ["unknown_schema"]
    assert gate.layout_counts == {"openai_chat": 1, "sharegpt": 1}
    assert gate.role_mapping() == {"sharegpt": {"human": "user", "gpt": "assistant"}}


def test_layout_gate_purpose_mismatch_is_one_file_level_error():
    gate = LayoutGate(purpose="dpo")
    gate.read({"messages": [U, A]}, 4)
    gate.read({"messages": [U, A]}, 5)
    assert codes(gate.file_issues) == ["schema_purpose_mismatch"] and gate.file_issues[0].line == 4
    assert "'sft'" in gate.file_issues[0].message


def test_key_issues_count_ignored_keys():
    facts = RowFacts()
    assert key_issues({"messages": [], "id": 1, "meta": {}}, LAYOUTS["openai_chat"], 1, facts) == []
    assert facts.ignored == {"id": 1, "meta": 1}


def test_text_and_roles_of_rows():
    pref = normalize_preference("q", "a", "b")
    assert canonical_text(pref.as_json()) == "q\na\nb"
    assert [m["role"] for m in row_messages(pref)] == ["user", "assistant", "assistant"]
    assert role_counts(ChatRow([S, U, A, U, A])) == {"system": 1, "user": 2, "assistant": 2}
    assert role_counts(TextRow("x")) == {"text": 1}
    assert map_contents(TextRow("ab"), str.upper) == TextRow("AB")
    call = {"messages": [U, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}]}
    assert canonical_text(call) == 'hi\nf({"a": 1})'  # tool calls count for dedup and screening


def test_pii_redaction_keeps_weights_and_other_keys():
    out = ChatRow([U, {"role": "assistant", "content": "mail bob@example.com", "weight": 1}])
    result = apply_pii(out, "redact")
    assert result.counts == {"email": 1}
    assert result.row.messages[1] == {"role": "assistant", "content": "mail [EMAIL]", "weight": 1}
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


def test_llama_factory_function_calling_sharegpt():
    row = {"conversations": [{"from": "human", "value": "Weather in Paris?"},
                             {"from": "function_call", "value": json.dumps({"name": "get_weather",
                                                                            "arguments": {"city": "Paris"}})},
                             {"from": "observation", "value": "18C"},
                             {"from": "gpt", "value": "It is 18C."}],
           "tools": json.dumps([{"name": "get_weather", "parameters": {"type": "object"}}])}
    gate, got = read(row)
    assert got.issues == []
    assert got.out.messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert got.out.messages[2] == {"role": "tool", "content": "18C"}
    assert got.out.tools == [{"type": "function", "function": {"name": "get_weather",
                                                                  "parameters": {"type": "object"}}}]
    assert gate.role_mapping()["sharegpt"] == {"human": "user", "function_call": "assistant", "observation": "tool",
                                               "gpt": "assistant"}
    bad = {"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "not json"}]}
    assert codes(read(bad)[1].issues) == ["bad_tool_call"]
