"""Chat message lists: role, content, per-message weight and role-order rules. Pure."""

from __future__ import annotations

from typing import Any

from .issues import Issue

ROLES = ("system", "user", "assistant")
MESSAGE_KEYS = {"role", "content", "weight", "name"}


def _check_message(m: Any, where: str, line: int) -> list[Issue]:
    if not isinstance(m, dict):
        return [Issue("message_not_object", f"{where} must be an object", line, where)]
    issues: list[Issue] = []
    unknown = sorted(str(k)[:40] for k in set(m) - MESSAGE_KEYS)
    if unknown:
        issues.append(Issue("unknown_key", f"{where} has unknown key(s): {', '.join(unknown[:10])}", line, where))
    if "role" not in m:
        issues.append(Issue("missing_key", f"{where} has no `role`", line, where + ".role"))
    elif m["role"] not in ROLES:
        issues.append(Issue("unknown_role", f"{where}.role {str(m['role'])[:40]!r} is not one of system/user/assistant",
                            line, where + ".role"))
    if "content" not in m:
        issues.append(Issue("missing_key", f"{where} has no `content`", line, where + ".content"))
    elif not isinstance(m["content"], str):
        issues.append(Issue("content_not_string", f"{where}.content must be a string, not {type(m['content']).__name__}",
                            line, where + ".content"))
    elif not m["content"].strip():
        issues.append(Issue("empty_content", f"{where}.content is empty", line, where + ".content"))
    if "weight" in m and (isinstance(m["weight"], bool) or m["weight"] not in (0, 1)):
        issues.append(Issue("bad_weight", f"{where}.weight must be 0 or 1, got {str(m['weight'])[:20]}",
                            line, where + ".weight"))
    return issues


def _check_order(messages: list[Any], path: str, line: int, *, continuation: bool) -> list[Issue]:
    """Role-order rules. `continuation`: the list continues a prompt (a preference answer)."""
    issues: list[Issue] = []
    seen_user = continuation
    prev = "user" if continuation else None
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        where = f"{path}[{i}]"
        if role == "system" and (i > 0 or continuation):
            issues.append(Issue("role_order", f"{where}: system message after the first turn", line, where))
        elif role == "assistant":
            if not seen_user:
                issues.append(Issue("role_order", f"{where}: assistant before any user message", line, where))
            elif prev == "assistant":
                issues.append(Issue("role_order", f"{where}: two assistant messages in a row", line, where))
        elif role == "user":
            seen_user = True
        prev = role
    return issues


def message_weight(m: dict) -> int:
    w = m.get("weight")
    return (1 if m.get("role") == "assistant" else 0) if w is None else int(w)


def check_messages(messages: Any, line: int, path: str = "messages", *, need_assistant: bool = True,
                   continuation: bool = False) -> list[Issue]:
    """Every issue of one message list (not just the first)."""
    if not isinstance(messages, list) or not messages:
        return [Issue("messages_not_list", f"`{path}` must be a non-empty list of messages", line, path)]
    issues: list[Issue] = []
    for i, m in enumerate(messages):
        issues += _check_message(m, f"{path}[{i}]", line)
    issues += _check_order(messages, path, line, continuation=continuation)
    if need_assistant:
        assistants = [m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
        if not assistants:
            issues.append(Issue("no_assistant", f"`{path}` has no assistant turn", line, path))
        elif not issues and not any(message_weight(m) for m in messages):
            issues.append(Issue("nothing_to_train", f"`{path}`: every message has weight 0", line, path))
    return issues
