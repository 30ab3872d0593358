"""The chat template an artifact was trained with, read from the tokenizer files saved beside it:
`chat_template.jinja`, else `tokenizer_config.json`'s `chat_template` (the one named `default` when it
names several). The registry hashes it into a model's lineage; serving renders prompts with it."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, JsonValue

TEMPLATE_FILES = ("chat_template.jinja", "tokenizer_config.json")


class _NamedTemplate(BaseModel):
    name: str | None = None
    template: str | None = None


class _TokenizerConfig(BaseModel):
    chat_template: str | list[_NamedTemplate | JsonValue] | None = None


def chat_template_from(files: Mapping[str, bytes]) -> str | None:
    """`files`: file name -> content, for those of TEMPLATE_FILES the artifact has. ValueError when
    tokenizer_config.json is not JSON of the expected shape."""
    jinja = files.get("chat_template.jinja")
    if jinja:
        return jinja.decode()
    raw = files.get("tokenizer_config.json")
    if not raw:
        return None
    value = _TokenizerConfig.model_validate_json(raw).chat_template
    if isinstance(value, list):
        return next((t.template for t in value if isinstance(t, _NamedTemplate) and t.name == "default"), None)
    return value
