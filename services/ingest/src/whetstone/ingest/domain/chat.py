"""Chat message lists in OpenAI's shape: validation and normalisation. Pure.

A message is `{"role", "content", "weight"?, "name"?, "tool_calls"?, "tool_call_id"?}`:

- `role`: system (or `developer`, read as system), user, assistant, tool;
- `content`: a string, or OpenAI's list of content parts; text parts are joined with a
  newline when there is nothing else. Image parts (`{"type": "image_url", "image_url": {"url",
  "detail"?}}`) are accepted in user messages of the chat layout (`images=True`): such a content
  stays a list of parts in the normalised row (text parts, then the image parts where they were);
  their bytes are checked by the gate's image pass (`domain/images.py`). Other parts (audio, file)
  are refused;
  an assistant turn that carries `tool_calls` may have empty or null content;
- `tool_calls` (assistant only): `[{"id"?, "type": "function", "function": {"name",
  "arguments"}}]`, arguments a JSON object or a string holding one (normalised to a string,
  as OpenAI writes them);
- `tool` messages answer an earlier call (`tool_call_id` must name one when given);
- `weight` 0/1: trained or not (default: assistant 1, every other role 0), `name`: a string.

Unknown keys of a message are ignored (the caller counts them), unless they look like a
typo of a known key (`contnet`), which is an error with the suggestion.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .images import DETAILS, IMAGE_ROLE, ImagePart
from .issues import Issue
from .jsontypes import JsonObject
from .suggest import closest

ROLES = ("system", "user", "assistant", "tool")
ROLE_ALIASES = {"developer": "system"}
MESSAGE_KEYS = frozenset({"role", "content", "weight", "name", "tool_calls", "tool_call_id"})
PLAIN_KEYS = frozenset({"role", "content", "weight", "name"})
IMAGE_MARK = "<image>"
MEDIA_PARTS = ("image_url", "input_audio", "file", "image", "audio", "input_image", "video")


def message_weight(m: JsonObject) -> int:
    w = m.get("weight")
    return (1 if m.get("role") == "assistant" else 0) if w is None else int(w)


def _check_image_part(part: JsonObject, role: Any, at: str, line: int) -> list[Issue]:
    """The structure of an image part (its bytes are checked by the gate's image pass)."""
    if role != IMAGE_ROLE:
        return [Issue("image_role", f"{at}: images are allowed only in user messages, not in a {role} message",
                      line, at)]
    image = part.get("image_url")
    if not isinstance(image, dict):
        return [Issue("image_part_invalid", f'{at}.image_url must be an object {{"url": "data:image/...;base64,'
                      '...", "detail"?}', line, at + ".image_url")]
    if not isinstance(image.get("url"), str) or not image["url"].strip():
        return [Issue("image_part_invalid", f"{at}.image_url.url must be a non-empty string", line,
                      at + ".image_url.url")]
    if "detail" in image and image["detail"] not in DETAILS:
        return [Issue("image_detail_invalid", f"{at}.image_url.detail {str(image['detail'])[:20]!r} must be one of "
                      f"{', '.join(DETAILS)}", line, at + ".image_url.detail")]
    return []


def _check_parts(parts: list[Any], where: str, line: int, role: Any = None, images: bool = False) -> list[Issue]:
    issues: list[Issue] = []
    for j, part in enumerate(parts):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            continue
        if kind == "image_url" and images:
            issues += _check_image_part(part, role, at, line)
        elif kind == "image_url":
            issues.append(Issue("content_part_unsupported", f"{at} is an image_url part; images are accepted only "
                                "in the OpenAI chat layout ({\"messages\": [...]}) of a supervised dataset",
                                line, at))
        elif kind in MEDIA_PARTS:
            issues.append(Issue("content_part_unsupported", f"{at} is an {kind} part; only text and image_url parts "
                                "can be trained (remove the part or use text)", line, at))
        else:
            issues.append(Issue("content_not_string", f"{at} must be a text part "
                                '{"type": "text", "text": "..."} or an image_url part', line, at))
    return issues


def part_text(parts: list[Any]) -> str:
    return "\n".join(p["text"] for p in parts if p.get("type") == "text")


def has_image(parts: list[Any]) -> bool:
    return any(p.get("type") == "image_url" for p in parts)


def _normal_part(part: JsonObject) -> JsonObject:
    if part["type"] == "text":
        return {"type": "text", "text": part["text"]}
    image = part["image_url"]
    return {"type": "image_url", "image_url": {"url": image["url"], **(
        {"detail": image["detail"]} if "detail" in image else {})}}


def _check_tool_calls(calls: Any, where: str, line: int) -> list[Issue]:
    at = f"{where}.tool_calls"
    if not isinstance(calls, list) or not calls:
        return [Issue("bad_tool_call", f"{at} must be a non-empty list", line, at)]
    issues: list[Issue] = []
    for j, call in enumerate(calls):
        c = f"{at}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            issues.append(Issue("bad_tool_call", f'{c} must be {{"type": "function", "function": {{"name", '
                                '"arguments"}}}}', line, c))
            continue
        if call.get("type", "function") != "function":
            issues.append(Issue("bad_tool_call", f"{c}.type must be 'function'", line, c + ".type"))
        if not isinstance(fn.get("name"), str) or not fn["name"].strip():
            issues.append(Issue("bad_tool_call", f"{c}.function.name must be a non-empty string", line,
                                c + ".function.name"))
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                issues.append(Issue("bad_tool_call", f"{c}.function.arguments is not valid JSON", line,
                                    c + ".function.arguments"))
                continue
        if not isinstance(args, dict):
            issues.append(Issue("bad_tool_call", f"{c}.function.arguments must be a JSON object", line,
                                c + ".function.arguments"))
    return issues


def _function_of(tool: Any) -> Any:
    """A tool definition's function: OpenAI's `{"type": "function", "function": {...}}` or a bare
    `{"name", "description", "parameters"}` (as LLaMA-Factory writes them)."""
    if not isinstance(tool, dict):
        return None
    return tool.get("function") if "function" in tool else (tool if "name" in tool else None)


def normalize_tools(tools: list[Any]) -> list[Any]:
    """Tool definitions in OpenAI's shape."""
    if all(isinstance(t, dict) and "function" in t for t in tools):
        return tools
    return [t if "function" in t else {"type": "function", "function": t} for t in tools]


def check_tools(tools: Any, line: int, path: str = "tools") -> list[Issue]:
    """OpenAI's tool definitions: `[{"type": "function", "function": {"name", "description"?, "parameters"?}}]`."""
    if not isinstance(tools, list) or not tools:
        return [Issue("bad_tool_call", f"`{path}` must be a non-empty list of tool definitions", line, path)]
    issues: list[Issue] = []
    for j, tool in enumerate(tools):
        fn = _function_of(tool)
        at = f"{path}[{j}]"
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"].strip():
            issues.append(Issue("bad_tool_call", f'{at} must be {{"type": "function", "function": {{"name", ...}}}}',
                                line, at))
        elif "parameters" in fn and not isinstance(fn["parameters"], dict):
            issues.append(Issue("bad_tool_call", f"{at}.function.parameters must be a JSON schema object", line, at))
    return issues


def _check_content(m: JsonObject, role: Any, where: str, line: int, images: bool) -> list[Issue]:
    calls = role == "assistant" and m.get("tool_calls")
    if "content" not in m:
        return [] if calls else [Issue("missing_key", f"{where} has no `content`", line, where + ".content")]
    content = m["content"]
    if content is None and calls:
        return []
    if isinstance(content, list):
        issues = _check_parts(content, where, line, role, images)
        if issues:
            return issues
        if has_image(content):
            return []          # an image alone is content enough
        content = part_text(content)
    if not isinstance(content, str):
        return [Issue("content_not_string", f"{where}.content must be a string or a list of text parts, not "
                      f"{type(content).__name__}", line, where + ".content")]
    if not calls and not content.strip():
        return [Issue("empty_content", f"{where}.content is empty", line, where + ".content")]
    return []


def _check_message(m: Any, where: str, line: int, ignore: Callable[[str], None] | None,
                   images: bool = False) -> list[Issue]:
    if not isinstance(m, dict):
        return [Issue("message_not_object", f"{where} must be an object", line, where)]
    issues: list[Issue] = []
    if not m.keys() <= MESSAGE_KEYS:
        for key in sorted(str(k)[:40] for k in m.keys() - MESSAGE_KEYS):
            guess = closest(key, MESSAGE_KEYS)
            if guess:
                issues.append(Issue("unknown_key", f"{where} has an unknown key `{key}`; did you mean `{guess}`?",
                                    line, f"{where}.{key}"))
            elif ignore is not None:
                ignore(f"{where.split('[')[0]}[].{key}")
    written = m.get("role")
    role = ROLE_ALIASES.get(written, written) if isinstance(written, str) else written
    if "role" not in m:
        issues.append(Issue("missing_key", f"{where} has no `role`", line, where + ".role"))
    elif role not in ROLES:
        guess = closest(str(role), ROLES) if isinstance(role, str) else None
        hint = f"; did you mean {guess!r}?" if guess else ""
        issues.append(Issue("unknown_role", f"{where}.role {str(m['role'])[:40]!r} is not one of "
                            f"system/user/assistant/tool{hint}", line, where + ".role"))
    issues += _check_content(m, role, where, line, images)
    if "tool_calls" in m:
        if role != "assistant":
            issues.append(Issue("bad_tool_call", f"{where}: only assistant messages make tool calls", line,
                                where + ".tool_calls"))
        else:
            issues += _check_tool_calls(m["tool_calls"], where, line)
    if "tool_call_id" in m and not isinstance(m["tool_call_id"], str):
        issues.append(Issue("bad_tool_call", f"{where}.tool_call_id must be a string", line, where + ".tool_call_id"))
    if "name" in m and not isinstance(m["name"], str):
        issues.append(Issue("field_not_string", f"{where}.name must be a string", line, where + ".name"))
    if "weight" in m and (isinstance(m["weight"], bool) or m["weight"] not in (0, 1)):
        issues.append(Issue("bad_weight", f"{where}.weight must be 0 or 1, got {str(m['weight'])[:20]}",
                            line, where + ".weight"))
    return issues


def _check_order(messages: list[Any], path: str, line: int, *, continuation: bool) -> list[Issue]:
    """Role-order rules. `continuation`: the list continues a prompt (a preference answer)."""
    issues: list[Issue] = []
    seen_user = continuation
    prev = "user" if continuation else None
    open_calls: set[str | None] | None = None   # ids of the last assistant turn's tool calls (None: no call to answer)
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
        where = f"{path}[{i}]"
        if role == "system" and (i > 0 or continuation):
            issues.append(Issue("role_order", f"{where}: system message after the first turn", line, where))
        elif role == "assistant":
            if not seen_user:
                issues.append(Issue("role_order", f"{where}: assistant before any user message", line, where))
            elif prev == "assistant":
                issues.append(Issue("role_order", f"{where}: two assistant messages in a row", line, where))
            calls = m.get("tool_calls")
            open_calls = {c.get("id") for c in calls if isinstance(c, dict)} if isinstance(calls, list) else None
        elif role == "tool":
            if open_calls is None:
                issues.append(Issue("role_order", f"{where}: a tool message must answer an assistant tool call",
                                    line, where))
            elif isinstance(m.get("tool_call_id"), str) and m["tool_call_id"] not in open_calls:
                issues.append(Issue("bad_tool_call", f"{where}.tool_call_id {m['tool_call_id'][:60]!r} names no tool "
                                    "call of the assistant turn before it", line, where + ".tool_call_id"))
        elif role == "user":
            seen_user = True
            open_calls = None
        prev = role
    return issues


def check_messages(messages: Any, line: int, path: str = "messages", *, need_assistant: bool = True,
                   continuation: bool = False, ignore: Callable[[str], None] | None = None,
                   images: bool = False) -> list[Issue]:
    """Every issue of one message list (not just the first). Unknown message keys go to `ignore`.
    `images`: image_url parts are accepted in user messages (the chat layout)."""
    if not isinstance(messages, list) or not messages:
        return [Issue("messages_not_list", f"`{path}` must be a non-empty list of messages", line, path)]
    issues: list[Issue] = []
    for i, m in enumerate(messages):
        if type(m) is dict and len(m) == 2 and m.get("role") in ROLES and type(m.get("content")) is str \
                and m["content"].strip():
            continue        # the common message, {"role", "content"} with some text: nothing to report
        issues += _check_message(m, f"{path}[{i}]", line, ignore, images)
    issues += _check_order(messages, path, line, continuation=continuation)
    if need_assistant:
        assistants = [m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
        if not assistants and not any(i.code == "unknown_role" for i in issues):  # a misspelt role said it already
            issues.append(Issue("no_assistant", f"`{path}` has no assistant turn", line, path))
        elif not issues and not any(message_weight(m) for m in messages):
            issues.append(Issue("nothing_to_train", f"`{path}`: every message has weight 0", line, path))
    return issues


# ------------------------------------------------------------------------ normalisation


def _normal_call(call: JsonObject) -> JsonObject:
    fn = call["function"]
    args = fn.get("arguments", {})
    out = {"type": "function", "function": {"name": fn["name"], "arguments": args if isinstance(args, str)
                                            else json.dumps(args, ensure_ascii=False)}}
    if isinstance(call.get("id"), str):
        out = {"id": call["id"], **out}
    return out


def normalize_message(m: JsonObject) -> JsonObject:
    """A valid message in the platform's form (only the known keys, content a string)."""
    role = ROLE_ALIASES.get(m["role"], m["role"])
    content = m.get("content")
    if isinstance(content, list):
        content = [_normal_part(p) for p in content] if has_image(content) else part_text(content)
    out: dict[str, Any] = {"role": role, "content": content or ""}
    for key in ("weight", "name", "tool_call_id"):
        if key in m:
            out[key] = m[key]
    if m.get("tool_calls"):
        out["tool_calls"] = [_normal_call(c) for c in m["tool_calls"]]
    return out


def normalize_messages(messages: list[JsonObject]) -> list[JsonObject]:
    """Messages as written: the list itself when it already is in the platform's form (the common case)."""
    for m in messages:
        if type(m.get("content")) is not str or not m.keys() <= PLAIN_KEYS or m["role"] in ROLE_ALIASES:
            return [normalize_message(m) for m in messages]
    return messages


def uses_tools(messages: list[JsonObject]) -> bool:
    return any("tool_calls" in m or m["role"] == "tool" for m in messages)


def message_text(m: JsonObject) -> str:
    """What the duplicate/contamination/toxicity checks read of a message: content plus its tool calls."""
    calls = m.get("tool_calls")
    content = m["content"] if type(m["content"]) is str else image_text(m["content"])
    if not calls:
        return content
    rendered = " ".join(f"{c['function']['name']}({c['function']['arguments']})" for c in calls)
    return f"{content}\n{rendered}" if content else rendered


def image_text(parts: list[Any]) -> str:
    """A content with images as the text checks read it: text parts, an `<image>` mark per image."""
    return "\n".join(p["text"] if p["type"] == "text" else IMAGE_MARK for p in parts)


def _image_part(i: int, j: int, image: JsonObject) -> ImagePart:
    return ImagePart(i, j, image["url"], image.get("detail", "auto"))


def row_images(messages: list[JsonObject]) -> list[ImagePart]:
    """Every image part of normalised messages, in order."""
    return [_image_part(i, j, p["image_url"]) for i, m in enumerate(messages) if type(m.get("content")) is list
            for j, p in enumerate(m["content"]) if p["type"] == "image_url"]
