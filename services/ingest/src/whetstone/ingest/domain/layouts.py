"""Input layouts: the shapes training files come in, detected per row and normalised. Pure.

| layout            | keys (optional)                                               | schema            |
|-------------------|---------------------------------------------------------------|-------------------|
| openai_dpo        | input {messages, tools?}, preferred_output, non_preferred_output | preference     |
| openai_chat       | messages (tools, parallel_tool_calls)                          | chat              |
| openai_rft        | messages ending with a user turn; every other key is the item  | rft               |
| sharegpt          | conversations [{from, value} or {role, content}] (system, tools) | chat            |
| trl_preference    | chosen, rejected (prompt): strings or message lists            | preference        |
| alpaca            | instruction, output (input, system, history)                   | instruction       |
| prompt_completion | prompt, completion                                             | prompt_completion |
| text              | text                                                           | text              |

A row fits a layout when it has all of the layout's required keys. When it fits several
(UltraFeedback rows carry `messages` beside `prompt`/`chosen`/`rejected`), the purpose
decides, then the schema the file already has, then the order above. A row that fits
none but has one of a layout's keys is read as that layout (its missing keys are errors).
An OpenAI reinforcement fine-tuning row (`{"messages": [..., user], "answer": ...}`) is read as
openai_rft when the purpose is rft, or when no purpose was given and the file's first row ends
with a user turn; with purpose sft (or once a file is chat) a row without an assistant turn stays
a chat error (`no_assistant`). Its other top-level keys are the grader's `{{item.x}}`: kept as
written, never ignored or read as typos.
Keys no layout reads are ignored and counted; a key within an edit or two of a key the
layout expects (`mesages`, `complection`) is an error with the suggestion.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .chat import check_messages, check_tools, normalize_messages, normalize_tools
from .issues import Issue
from .jsontypes import JsonObject
from .normal import ChatRow, NormalRow, TextRow
from .schemas import PURPOSE_SCHEMAS, Schema, normalize_preference
from .suggest import closest

MAX_IGNORED_KEYS = 50


@dataclass
class RowFacts:
    """What reading rows taught about the file: ignored keys and role mappings, with row counts."""

    ignored: dict[str, int] = field(default_factory=dict)
    role_mapping: dict[str, dict[str, str]] = field(default_factory=dict)

    def ignore(self, key: str) -> None:
        if key in self.ignored or len(self.ignored) < MAX_IGNORED_KEYS:
            self.ignored[key] = self.ignored.get(key, 0) + 1

    def mapped(self, layout: str, source: str, target: str) -> None:
        roles = self.role_mapping.setdefault(layout, {})
        if source not in roles and len(roles) < 20:
            roles[source] = target


Validator = Callable[[JsonObject, int, RowFacts], list[Issue]]
Normaliser = Callable[[JsonObject], NormalRow]


@dataclass(frozen=True)
class Layout:
    name: str
    schema: Schema
    required: frozenset[str]
    optional: frozenset[str]
    signs: tuple[str, ...]                      # keys that point to this layout even when others are missing
    validate: Validator
    normalize: Normaliser
    roles: tuple[tuple[str, str], ...] = ()     # fixed field -> role mapping, reported
    item_keys: bool = False                     # keys beyond `keys` are the row's item (kept, not reported)

    @property
    def keys(self) -> frozenset[str]:
        return self.required | self.optional


# --------------------------------------------------------------------------- helpers


def _text(row: JsonObject, key: str, line: int, *, allow_empty: bool = False) -> list[Issue]:
    if key not in row:
        return []
    value = row[key]
    if not isinstance(value, str):
        return [Issue("field_not_string", f"`{key}` must be a string, not {type(value).__name__}", line, key)]
    if not allow_empty and not value.strip():
        return [Issue("empty_field", f"`{key}` is empty", line, key)]
    return []


def _tools_of(value: Any) -> Any:
    """`tools` as written: a list, or (LLaMA-Factory) a JSON string of one; [] and null mean none."""
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _check_tools_key(row: JsonObject, line: int, path: str = "tools") -> list[Issue]:
    tools = _tools_of(row.get("tools"))
    return check_tools(tools, line, path) if tools not in (None, [], "") else []


def _normal_tools(row: JsonObject) -> list[Any] | None:
    """The row's tool definitions in OpenAI's shape; None when it declares none."""
    tools = _tools_of(row.get("tools"))
    return normalize_tools(tools) if tools else None


# ------------------------------------------------------------------------ openai chat


def _v_chat(row: JsonObject, line: int, facts: RowFacts) -> list[Issue]:
    return check_messages(row["messages"], line, ignore=facts.ignore, images=True) + _check_tools_key(row, line)


def _n_chat(row: JsonObject) -> NormalRow:
    return ChatRow(normalize_messages(row["messages"]), _normal_tools(row))


# ------------------------------------------------------------------- openai rft


def _v_rft(row: JsonObject, line: int, facts: RowFacts) -> list[Issue]:
    messages = row["messages"]
    issues = check_messages(messages, line, need_assistant=False, ignore=facts.ignore)
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        role = messages[-1].get("role")
        if role != "user":
            at = f"messages[{len(messages) - 1}].role"
            issues.append(Issue("last_message_not_user", f"{at} is {str(role)[:40]!r}; in reinforcement fine-tuning "
                                "the last message must be 'user' (the model writes the next turn; a file is read as "
                                "reinforcement data when its first row ends with a user turn or its purpose is rft)",
                                line, at))
    return issues


def _n_rft(row: JsonObject) -> NormalRow:
    return ChatRow(normalize_messages(row["messages"]), row.get("tools") or None, item=row)


def ends_with_user(row: JsonObject) -> bool:
    messages = row.get("messages")
    return isinstance(messages, list) and bool(messages) and isinstance(messages[-1], dict) \
        and messages[-1].get("role") == "user"


# --------------------------------------------------------------------------- sharegpt

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
                  "bard": "assistant", "bing": "assistant", "model": "assistant", "bot": "assistant",
                  "system": "system", "observation": "tool", "tool": "tool", "function_response": "tool",
                  "ipython": "tool", "function_call": "assistant"}
TURN_KEYS = frozenset({"from", "value", "role", "content", "weight", "name"})


def _turn(t: JsonObject) -> tuple[Any, Any]:
    return (t.get("from"), t.get("value")) if "from" in t or "value" in t else (t.get("role"), t.get("content"))


def _call_turn(value: Any) -> JsonObject | None:
    """A LLaMA-Factory `function_call` turn's value -> an assistant message with one tool call."""
    try:
        call = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    args = call.get("arguments", {})
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": call["name"], "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}}]}


def _sharegpt_messages(row: JsonObject) -> list[JsonObject]:
    """Turns as OpenAI messages (valid rows only)."""
    messages: list[JsonObject] = []
    if isinstance(row.get("system"), str) and row["system"].strip():
        messages.append({"role": "system", "content": row["system"]})
    for t in row["conversations"]:
        source, value = _turn(t)
        if source == "function_call":
            call = _call_turn(value)
            assert call is not None         # checked by _v_sharegpt
            messages.append(call)
            continue
        m = {"role": SHAREGPT_ROLES[source], "content": value}
        for key in ("weight", "name"):
            if key in t:
                m[key] = t[key]
        messages.append(m)
    return messages


def _v_sharegpt(row: JsonObject, line: int, facts: RowFacts) -> list[Issue]:
    turns = row["conversations"]
    if not isinstance(turns, list) or not turns:
        return [Issue("messages_not_list", "`conversations` must be a non-empty list of turns", line, "conversations")]
    issues = _text(row, "system", line, allow_empty=True) + _check_tools_key(row, line)
    for i, t in enumerate(turns):
        where = f"conversations[{i}]"
        if not isinstance(t, dict):
            issues.append(Issue("message_not_object", f"{where} must be an object", line, where))
            continue
        for key in t.keys() - TURN_KEYS:
            facts.ignore(f"conversations[].{key}")
        source, value = _turn(t)
        role = SHAREGPT_ROLES.get(source) if isinstance(source, str) else None
        if role is None:
            guess = closest(str(source), SHAREGPT_ROLES) if isinstance(source, str) else None
            hint = f"; did you mean {guess!r}?" if guess else ""
            issues.append(Issue("unknown_role", f"{where}.from {str(source)[:40]!r} is not a ShareGPT role (human, "
                                f"gpt, system, observation, function_call){hint}", line, where + ".from"))
        elif source == "function_call" and _call_turn(value) is None:
            issues.append(Issue("bad_tool_call", f'{where}.value must be JSON {{"name", "arguments"}}', line,
                                where + ".value"))
        else:
            facts.mapped("sharegpt", source, role)
    if issues:
        return issues
    return check_messages(_sharegpt_messages(row), line, "conversations", ignore=facts.ignore)


def _n_sharegpt(row: JsonObject) -> NormalRow:
    return ChatRow(normalize_messages(_sharegpt_messages(row)), _normal_tools(row))


# ------------------------------------------------------------------------- preference


def _v_preference_sides(prompt: Any, chosen: Any, rejected: Any, line: int, facts: RowFacts,
                        names: tuple[str, str, str]) -> list[Issue]:
    issues: list[Issue] = []
    p_name, c_name, r_name = names
    if isinstance(prompt, list):
        issues += check_messages(prompt, line, p_name, need_assistant=False, ignore=facts.ignore)
    elif prompt is not None:
        issues += _text({p_name: prompt}, p_name, line)
    for name, value in ((c_name, chosen), (r_name, rejected)):
        if isinstance(value, list):
            issues += check_messages(value, line, name, continuation=prompt is not None, ignore=facts.ignore)
        else:
            issues += _text({name: value}, name, line)
    if issues:
        return issues
    if prompt is None and not (isinstance(chosen, list) and isinstance(rejected, list)):
        return [Issue("missing_key", f"missing `{p_name}` (text answers need a prompt)", line, p_name)]
    pair = normalize_preference(prompt, chosen, rejected)
    if pair.chosen == pair.rejected:
        return [Issue("chosen_equals_rejected", f"{c_name} and {r_name} are identical", line)]
    if not pair.prompt:
        return [Issue("missing_key", f"{c_name} and {r_name} share no prompt", line, p_name)]
    return []


def _v_trl(row: JsonObject, line: int, facts: RowFacts) -> list[Issue]:
    return _v_preference_sides(row.get("prompt"), row["chosen"], row["rejected"], line, facts,
                               ("prompt", "chosen", "rejected"))


def _n_trl(row: JsonObject) -> NormalRow:
    return normalize_preference(row.get("prompt"), row["chosen"], row["rejected"]).map_messages(normalize_messages)


def _v_openai_dpo(row: JsonObject, line: int, facts: RowFacts) -> list[Issue]:
    source = row["input"]
    if not isinstance(source, dict) or "messages" not in source:
        return [Issue("missing_key", '`input` must be an object with `messages` ({"input": {"messages": [...]}})',
                      line, "input.messages")]
    for key in source.keys() - {"messages", "tools", "parallel_tool_calls"}:
        facts.ignore(f"input.{key}")
    issues = _check_tools_key(source, line, "input.tools")
    for side in ("preferred_output", "non_preferred_output"):
        if not isinstance(row[side], list):
            issues.append(Issue("messages_not_list", f"`{side}` must be a list of assistant messages", line, side))
    return issues or _v_preference_sides(source["messages"], row["preferred_output"], row["non_preferred_output"],
                                         line, facts, ("input.messages", "preferred_output", "non_preferred_output"))


def _n_openai_dpo(row: JsonObject) -> NormalRow:
    source = row["input"]
    pair = normalize_preference(source["messages"], row["preferred_output"], row["non_preferred_output"])
    return replace(pair.map_messages(normalize_messages), tools=_normal_tools(source))


# ----------------------------------------------------------------- alpaca and prompt/completion


def _v_alpaca(row: JsonObject, line: int, facts: RowFacts) -> list[Issue]:
    issues = (_text(row, "instruction", line) + _text(row, "input", line, allow_empty=True)
              + _text(row, "output", line) + _text(row, "system", line, allow_empty=True))
    history = row.get("history")
    if history not in (None, []) and not (isinstance(history, list) and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) and x.strip() for x in p) for p in history)):
        issues.append(Issue("field_not_string", "`history` must be a list of [instruction, answer] string pairs",
                            line, "history"))
    return issues


def _n_alpaca(row: JsonObject) -> NormalRow:
    messages = [{"role": "system", "content": row["system"]}] if (row.get("system") or "").strip() else []
    for question, answer in row.get("history") or ():
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    user = row["instruction"] if not row.get("input") else f"{row['instruction']}\n\n{row['input']}"
    return ChatRow([*messages, {"role": "user", "content": user}, {"role": "assistant", "content": row["output"]}])


def _v_prompt_completion(row: JsonObject, line: int, facts: RowFacts) -> list[Issue]:
    return _text(row, "prompt", line) + _text(row, "completion", line)


def _n_prompt_completion(row: JsonObject) -> NormalRow:
    return ChatRow([{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["completion"]}])


def _v_text(row: JsonObject, line: int, facts: RowFacts) -> list[Issue]:
    return _text(row, "text", line)


def _n_text(row: JsonObject) -> NormalRow:
    return TextRow(row["text"])


def _f(*keys: str) -> frozenset[str]:
    return frozenset(keys)


LAYOUTS: dict[str, Layout] = {lay.name: lay for lay in (
    Layout("openai_dpo", Schema.PREFERENCE, _f("input", "preferred_output", "non_preferred_output"), _f(),
           ("preferred_output", "non_preferred_output"), _v_openai_dpo, _n_openai_dpo,
           (("input.messages", "prompt"), ("preferred_output", "chosen"), ("non_preferred_output", "rejected"))),
    Layout("openai_chat", Schema.CHAT, _f("messages"), _f("tools", "parallel_tool_calls"), ("messages",), _v_chat,
           _n_chat),
    Layout("openai_rft", Schema.RFT, _f("messages"), _f(), (), _v_rft, _n_rft, item_keys=True),
    Layout("sharegpt", Schema.CHAT, _f("conversations"), _f("system", "tools"), ("conversations",), _v_sharegpt,
           _n_sharegpt),
    Layout("trl_preference", Schema.PREFERENCE, _f("chosen", "rejected"), _f("prompt"), ("chosen", "rejected"), _v_trl,
           _n_trl),
    Layout("alpaca", Schema.INSTRUCTION, _f("instruction", "output"), _f("input", "system", "history"),
           ("instruction", "output"), _v_alpaca, _n_alpaca,
           (("instruction", "user"), ("input", "user"), ("output", "assistant"), ("system", "system"))),
    Layout("prompt_completion", Schema.PROMPT_COMPLETION, _f("prompt", "completion"), _f(), ("prompt", "completion"),
           _v_prompt_completion, _n_prompt_completion, (("prompt", "user"), ("completion", "assistant"))),
    Layout("text", Schema.TEXT, _f("text"), _f(), ("text",), _v_text, _n_text),
)}
SIGN_KEYS = frozenset(k for lay in LAYOUTS.values() for k in lay.signs)
CHAT = LAYOUTS["openai_chat"]
RFT = LAYOUTS["openai_rft"]


@dataclass(frozen=True)
class Choice:
    layout: Layout | None
    alternatives: tuple[str, ...] = ()      # other layouts the row fits, when the choice was a default


def choose(row: JsonObject, purpose: str | None, schema: str | None) -> Choice:
    """The layout a row is read as (see the module docstring)."""
    if "messages" in row and (purpose == "rft" or (purpose is None and (
            schema == "rft" or (schema is None and ends_with_user(row))))):
        return Choice(RFT)
    if len(row) == 1 and "messages" in row:
        return Choice(CHAT)
    fits = [lay for lay in LAYOUTS.values() if lay.required <= row.keys() and not lay.item_keys]
    candidates = fits or [lay for lay in LAYOUTS.values() if any(k in row for k in lay.signs)]
    if len(candidates) <= 1:
        return Choice(candidates[0] if candidates else None)
    if purpose:
        wanted = [lay for lay in candidates if lay.schema in PURPOSE_SCHEMAS[purpose]]
        if wanted:
            return Choice(wanted[0])
    if schema:
        same = [lay for lay in candidates if lay.schema == schema]
        if same:
            return Choice(same[0])
    others = tuple(lay.name for lay in candidates[1:] if lay.schema != candidates[0].schema)
    return Choice(candidates[0], others if fits else ())


def key_issues(row: JsonObject, layout: Layout | None, line: int, facts: RowFacts) -> list[Issue]:
    """Missing keys, typo'd keys (errors) and unknown keys (ignored, counted)."""
    if layout is None:
        typos = [(k, closest(k, SIGN_KEYS)) for k in map(str, row)]
        return [Issue("unknown_key", f"unknown key `{k[:40]}`; did you mean `{g}`?", line, k) for k, g in typos if g]
    issues: list[Issue] = []
    if layout.item_keys:
        return [Issue("missing_key", f"missing `{key}` ({layout.name} layout)", line, key)
                for key in sorted(layout.required - row.keys())]
    absent = layout.keys - row.keys()
    meant: set[str] = set()
    for key in row.keys() - layout.keys:
        guess = closest(str(key), absent)
        if guess:
            meant.add(guess)
            issues.append(Issue("unknown_key", f"unknown key `{str(key)[:40]}`; did you mean `{guess}`?", line,
                                str(key)[:40]))
        else:
            facts.ignore(str(key)[:40])
    for key in sorted(layout.required - row.keys() - meant):
        issues.append(Issue("missing_key", f"missing `{key}` ({layout.name} layout)", line, key))
    return issues
