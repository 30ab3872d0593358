"""The example schemas, their detection, validation and normalized output. Pure.

| schema            | keys                                        | purposes   | output row            |
|-------------------|---------------------------------------------|------------|-----------------------|
| chat              | messages                                    | sft, eval  | {"messages"}          |
| prompt_completion | prompt, completion                          | sft, eval  | {"messages"} (chat)   |
| instruction       | instruction, input (optional), output       | sft, eval  | {"messages"} (chat)   |
| preference        | prompt (optional), chosen, rejected         | dpo        | {"prompt","chosen","rejected"} as message lists |
| text              | text                                        | cpt, eval  | {"text"}              |

prompt/completion and instruction rows are written as chat conversations (user ->
assistant) because that is what the trainer reads. Preference sides may be strings
or message lists; an "implicit prompt" pair (no `prompt`, both sides full
conversations) is split at their longest common prefix.
"""

from __future__ import annotations

from .chat import check_messages
from .issues import Issue

SCHEMAS = ("chat", "prompt_completion", "instruction", "preference", "text")
PURPOSES = ("sft", "dpo", "cpt", "eval")
PURPOSE_SCHEMAS: dict[str, tuple[str, ...]] = {
    "sft": ("chat", "prompt_completion", "instruction"),
    "dpo": ("preference",),
    "cpt": ("text",),
    "eval": ("chat", "prompt_completion", "instruction", "text"),
}
SCHEMA_KEYS: dict[str, tuple[set[str], set[str]]] = {  # required, optional
    "chat": ({"messages"}, set()),
    "prompt_completion": ({"prompt", "completion"}, set()),
    "instruction": ({"instruction", "output"}, {"input"}),
    "preference": ({"chosen", "rejected"}, {"prompt"}),
    "text": ({"text"}, set()),
}
OUTPUT_SCHEMA = {"chat": "chat", "prompt_completion": "chat", "instruction": "chat",
                 "preference": "preference", "text": "text"}


def detect_schema(row: dict) -> str | None:
    """The schema a row's keys point to, or None."""
    if "messages" in row:
        return "chat"
    if "chosen" in row or "rejected" in row:
        return "preference"
    if "instruction" in row or "output" in row:
        return "instruction"
    if "completion" in row or "prompt" in row:
        return "prompt_completion"
    if "text" in row:
        return "text"
    return None


def default_purpose(schema: str) -> str:
    return {"preference": "dpo", "text": "cpt"}.get(schema, "sft")


def _check_keys(row: dict, schema: str, line: int) -> list[Issue]:
    required, optional = SCHEMA_KEYS[schema]
    issues = [Issue("missing_key", f"missing `{k}` ({schema} schema)", line, k) for k in sorted(required - set(row))]
    unknown = sorted(str(k)[:40] for k in set(row) - required - optional)
    if unknown:
        listed = ", ".join(unknown[:10]) + (f" (+{len(unknown) - 10} more)" if len(unknown) > 10 else "")
        issues.append(Issue("unknown_key", f"unknown key(s) for the {schema} schema: {listed}", line))
    return issues


def _check_text(row: dict, key: str, line: int, *, allow_empty: bool = False) -> list[Issue]:
    if key not in row:
        return []
    value = row[key]
    if not isinstance(value, str):
        return [Issue("field_not_string", f"`{key}` must be a string, not {type(value).__name__}", line, key)]
    if not allow_empty and not value.strip():
        return [Issue("empty_field", f"`{key}` is empty", line, key)]
    return []


def _check_preference(row: dict, line: int) -> list[Issue]:
    issues: list[Issue] = []
    prompt = row.get("prompt")
    if isinstance(prompt, list):
        issues += check_messages(prompt, line, "prompt", need_assistant=False)
    elif "prompt" in row:
        issues += _check_text(row, "prompt", line)
    for side in ("chosen", "rejected"):
        value = row.get(side)
        if isinstance(value, list):
            issues += check_messages(value, line, side, continuation="prompt" in row)
        elif side in row:
            issues += _check_text(row, side, line)
    if not issues and "prompt" not in row and not (isinstance(row["chosen"], list) and isinstance(row["rejected"], list)):
        issues.append(Issue("missing_key", "missing `prompt` (text answers need a prompt)", line, "prompt"))
    if not issues:
        pair = normalize_preference(row)
        if pair["chosen"] == pair["rejected"]:
            issues.append(Issue("chosen_equals_rejected", "chosen and rejected are identical", line))
        elif not pair["prompt"]:
            issues.append(Issue("missing_key", "chosen and rejected share no prompt", line, "prompt"))
    return issues


def validate_row(row: dict, schema: str, line: int) -> list[Issue]:
    """Every issue of one row of a known schema."""
    issues = _check_keys(row, schema, line)
    if schema == "chat":
        if "messages" in row:
            issues += check_messages(row["messages"], line)
    elif schema == "prompt_completion":
        issues += _check_text(row, "prompt", line) + _check_text(row, "completion", line)
    elif schema == "instruction":
        issues += (_check_text(row, "instruction", line) + _check_text(row, "input", line, allow_empty=True)
                   + _check_text(row, "output", line))
    elif schema == "preference":
        if not any(i.code == "missing_key" for i in issues):
            issues += _check_preference(row, line)
    elif schema == "text":
        issues += _check_text(row, "text", line)
    return issues


def _as_messages(value: str | list, role: str) -> list[dict]:
    return value if isinstance(value, list) else [{"role": role, "content": value}]


def normalize_preference(row: dict) -> dict:
    """Explicit conversational form: prompt, chosen and rejected as message lists."""
    chosen, rejected = _as_messages(row["chosen"], "assistant"), _as_messages(row["rejected"], "assistant")
    if "prompt" in row:
        return {"prompt": _as_messages(row["prompt"], "user"), "chosen": chosen, "rejected": rejected}
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    return {"prompt": chosen[:shared], "chosen": chosen[shared:], "rejected": rejected[shared:]}


def normalize_row(row: dict, schema: str) -> dict:
    """The row as written to train/validation (see the module table)."""
    if schema == "chat":
        return {"messages": row["messages"]}
    if schema == "prompt_completion":
        return {"messages": [{"role": "user", "content": row["prompt"]},
                             {"role": "assistant", "content": row["completion"]}]}
    if schema == "instruction":
        user = row["instruction"] if not row.get("input") else f"{row['instruction']}\n\n{row['input']}"
        return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": row["output"]}]}
    if schema == "preference":
        return normalize_preference(row)
    return {"text": row["text"]}


def row_messages(out: dict) -> list[dict]:
    """Every message of a normalized row, in order (a text row is one message)."""
    if "messages" in out:
        return out["messages"]
    if "chosen" in out:
        return [*out["prompt"], *out["chosen"], *out["rejected"]]
    return [{"role": "text", "content": out["text"]}]


def canonical_text(out: dict) -> str:
    """The text the duplicate, contamination and toxicity checks look at."""
    return "\n".join(m["content"] for m in row_messages(out))
