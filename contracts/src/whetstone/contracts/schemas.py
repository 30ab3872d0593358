"""JSON Schema + AsyncAPI generation and the backward-compatibility check.

`python -m whetstone.contracts.schemas write` rewrites contracts/schemas/ and
contracts/asyncapi.json; `... check` exits 1 when the current models break a
committed schema.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .base import Envelope
from .topics import DLQ_MODEL, TOPICS

CONTRACTS_DIR = Path(__file__).resolve().parents[3]
SCHEMA_DIR = CONTRACTS_DIR / "schemas"


def schema_filename(event_type: str, version: int) -> str:
    return f"{event_type}.v{version}.json"


def current_schemas() -> dict[str, dict[str, Any]]:
    out = {}
    for model in [t.model for t in TOPICS.values()] + [DLQ_MODEL]:
        schema = model.model_json_schema(mode="validation")
        schema["$id"] = f"urn:whetstone:{model.EVENT_TYPE}:v{model.SCHEMA_VERSION}"
        out[schema_filename(model.EVENT_TYPE, model.SCHEMA_VERSION)] = schema
    out["envelope.v1.json"] = Envelope.model_json_schema(mode="validation")
    return out


def asyncapi_document() -> dict[str, Any]:
    channels, operations, messages = {}, {}, {}
    for t in TOPICS.values():
        msg_name = t.model.__name__
        messages[msg_name] = {
            "name": t.model.EVENT_TYPE,
            "title": msg_name,
            "contentType": "application/json",
            "headers": {"$ref": "./schemas/envelope.v1.json"},
            "payload": {"$ref": f"./schemas/{schema_filename(t.model.EVENT_TYPE, t.model.SCHEMA_VERSION)}"},
            "bindings": {"kafka": {"key": {"type": "string", "description": f"payload.{t.key_field}"}}},
        }
        channels[t.name] = {
            "address": t.name,
            "messages": {msg_name: {"$ref": f"#/components/messages/{msg_name}"}},
            "bindings": {"kafka": {"topic": t.name, "partitions": t.partitions}},
        }
        operations[f"publish_{t.name}"] = {"action": "send", "channel": {"$ref": f"#/channels/{t.name}"}}
    return {
        "asyncapi": "3.0.0",
        "info": {"title": "Whetstone events", "version": "1.0.0",
                 "description": "Every message is an Envelope whose payload is the event below."},
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def write(out_dir: Path = CONTRACTS_DIR) -> list[Path]:
    (out_dir / "schemas").mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in current_schemas().items():
        p = out_dir / "schemas" / name
        p.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(p)
    p = out_dir / "asyncapi.json"
    p.write_text(json.dumps(asyncapi_document(), indent=2) + "\n")
    written.append(p)
    return written


# ------------------------------------------------------------ compatibility


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = root.get("$defs", {}).get(name, {})
    return schema


def _types(schema: dict[str, Any], root: dict[str, Any]) -> set[str]:
    schema = _resolve(schema, root)
    if "anyOf" in schema:
        return set().union(*(_types(s, root) for s in schema["anyOf"]))
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        return {f"enum:{v}" for v in values}
    t = schema.get("type")
    if t == "object" and "properties" in schema:
        return {"object"}
    return {t if isinstance(t, str) else json.dumps(t)} if t else {"any"}


def incompatibilities(old: dict[str, Any], new: dict[str, Any], path: str = "",
                      old_root: dict[str, Any] | None = None, new_root: dict[str, Any] | None = None) -> list[str]:
    """Reasons why data valid for a reader of ``new`` might break a reader of ``old``
    or vice versa: removed/renamed fields, changed types, new required fields,
    enum values removed."""
    old_root, new_root = old_root or old, new_root or new
    old, new = _resolve(old, old_root), _resolve(new, new_root)
    problems: list[str] = []
    old_props, new_props = old.get("properties", {}), new.get("properties", {})
    for name, old_field in old_props.items():
        where = f"{path}{name}"
        if name not in new_props:
            problems.append(f"{where}: field removed or renamed")
            continue
        ot, nt = _types(old_field, old_root), _types(new_props[name], new_root)
        old_enum = {t for t in ot if t.startswith("enum:")}
        if old_enum and not old_enum <= nt:
            problems.append(f"{where}: enum values removed {sorted(old_enum - nt)}")
        elif not old_enum and not ot <= nt:
            problems.append(f"{where}: type changed {sorted(ot)} -> {sorted(nt)}")
        problems += incompatibilities(old_field, new_props[name], where + ".", old_root, new_root)
    new_required = set(new.get("required", [])) - set(old.get("required", []))
    for name in sorted(new_required):
        problems.append(f"{path}{name}: new required field")
    return problems


def check(schema_dir: Path = SCHEMA_DIR) -> list[str]:
    problems = []
    current = current_schemas()
    for committed in sorted(schema_dir.glob("*.json")):
        if committed.name not in current:
            problems.append(f"{committed.name}: schema removed (bump to a new version, keep the old one)")
            continue
        old = json.loads(committed.read_text())
        problems += [f"{committed.name}: {p}" for p in incompatibilities(old, current[committed.name])]
    return problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["write"]:
        problems = check()
        if problems and "--force" not in argv:
            print("refusing to overwrite: backward-incompatible changes:\n  " + "\n  ".join(problems))
            return 1
        for p in write():
            print(f"wrote {p.relative_to(CONTRACTS_DIR.parent)}")
        return 0
    if argv[:1] == ["check"]:
        problems = check()
        print("\n".join(problems) if problems else "schemas compatible")
        return 1 if problems else 0
    print("usage: python -m whetstone.contracts.schemas write [--force] | check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
