"""The base model's own tokenizer and chat template: token counts, loss masks, previews.

Chat rows go through `whetstone.modelkit.chat` (the same masking the trainer uses):
labels are -100 except on the trained tokens (assistant turns by default, per-message
`weight` when given; tool results and user turns are never trained unless weighted 1).
Rows with tools, tool calls or tool messages are rendered with the template's own tool
support; a template without it (probed once) refuses them with `ToolsUnsupported`.
Preference rows are tokenized as prompt+chosen and prompt+rejected; text rows (continued
pre-training) train on every token. Chat rows with images need a base with an image processor
(`whetstone.modelkit.vision`): each image counts the tokens its processor inserts (never
trained); a text-only base refuses them with `ImagesUnsupported`.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, JsonValue, TypeAdapter

from ..domain.chat import uses_tools
from ..domain.normal import ChatRow, NormalRow, PreferenceRow

DEFAULT_MAX_SEQ_LEN = 4096
_IGNORE = -100


class TokenizerUnavailable(Exception):
    pass


class ToolsUnsupported(ValueError):
    """A row uses tools but the base model's chat template does not render them."""


class ImagesUnsupported(ValueError):
    """A row has images but the base model has no image processor."""


_PROBE_TOOL, _PROBE_CALL, _PROBE_RESULT = "whetstone_probe_tool", "whetstone_probe_call", "whetstone_probe_result"
_PROBE = [{"role": "user", "content": "probe"},
          {"role": "assistant", "content": "", "tool_calls": [
              {"id": "call_0", "type": "function", "function": {"name": _PROBE_CALL, "arguments": '{"x": 1}'}}]},
          {"role": "tool", "tool_call_id": "call_0", "content": _PROBE_RESULT},
          {"role": "assistant", "content": "done"}]
_PROBE_TOOLS = [{"type": "function", "function": {"name": _PROBE_TOOL, "description": "probe",
                                                  "parameters": {"type": "object", "properties": {}}}}]


@dataclass(frozen=True)
class TokenSequence:
    """One rendered sequence: token ids and their labels (-100 where not trained)."""
    input_ids: list[int]
    labels: list[int]


@dataclass
class Tokenized:
    tokens: int                  # tokens kept (after truncation), both sequences for a preference pair
    longest: int                 # the longest single sequence (what max_seq_len limits)
    trained: int                 # tokens with a label
    record: dict[str, list[int]]     # input_ids / labels (truncated when asked)


def tokenizer_fingerprint(tok) -> str:
    """sha256 over what decides token ids: vocabulary + merges + normalizers, special tokens, template."""
    backend = getattr(tok, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else json.dumps(sorted(tok.get_vocab().items()))
    extra = {"template": tok.chat_template, "special": {k: str(v) for k, v in tok.special_tokens_map.items()},
             "class": type(tok).__name__}
    return hashlib.sha256(body.encode() + json.dumps(extra, sort_keys=True).encode()).hexdigest()


class _TensorEntry(BaseModel):
    """A tensor of a safetensors header: its shape is all the parameter count needs."""
    model_config = ConfigDict(extra="ignore")
    shape: list[int] = []


_SAFETENSORS_HEADER = TypeAdapter(dict[str, JsonValue])


def _safetensors_params(path: Path) -> int:
    """The parameters a safetensors file holds; a ValueError when its header is not a safetensors header."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = _SAFETENSORS_HEADER.validate_json(f.read(size))
    return sum(math.prod(_TensorEntry.model_validate(info).shape)
               for name, info in header.items() if name != "__metadata__")


class _ModelShape(BaseModel):
    """The sizes a transformers config.json gives, enough to count a decoder's parameters."""
    model_config = ConfigDict(extra="ignore")
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    intermediate_size: int | None = None      # absent: 4 x hidden_size

    @property
    def params(self) -> int:
        h, inter = self.hidden_size, self.intermediate_size or 4 * self.hidden_size
        return int(self.num_hidden_layers * (4 * h * h + 3 * h * inter) + 2 * self.vocab_size * h)


def model_params(location: str) -> tuple[int | None, str]:
    """Parameter count of a local checkpoint (safetensors headers, else config.json), else (None, 'default')."""
    d = Path(location)
    if not d.is_dir():
        return None, "default"
    shards = sorted(d.glob("*.safetensors"))
    if shards:
        try:
            return sum(_safetensors_params(s) for s in shards), "safetensors"
        except (OSError, ValueError, struct.error):
            pass
    try:
        return _ModelShape.model_validate_json((d / "config.json").read_bytes()).params, "config"
    except (OSError, ValueError):       # pydantic's ValidationError is a ValueError
        return None, "default"


class BaseModelTokenizer:
    """Tokenization of normalized rows with one base model's tokenizer."""

    def __init__(self, tokenizer, ref: str, location: str, processor=None) -> None:
        self.tok, self.ref, self.location = tokenizer, ref, location
        self.processor = processor
        self.hash = tokenizer_fingerprint(tokenizer)
        self.image_seq_length: int | None = None      # tokens per image at the processor's size (vision bases)
        if processor is not None:
            self.image_token = processor.image_token
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            crop = getattr(processor.image_processor, "crop_size", None) or {}
            size = (crop.get("height", 224), crop.get("width", 224)) if isinstance(crop, dict) else (224, 224)
            self.image_seq_length = self._image_counts([size])[0]
            self.hash = hashlib.sha256(f"{self.hash}|{type(processor).__name__}|{self.image_token}|"
                                       f"{self.image_seq_length}".encode()).hexdigest()
        self._tool_support: bool | None = None
        limit = getattr(tokenizer, "model_max_length", None)
        self.model_max_length = int(limit) if isinstance(limit, int) and 0 < limit <= 1_000_000 else None

    @classmethod
    def load(cls, ref: str, catalog: Path | None = None) -> BaseModelTokenizer:
        from transformers import AutoTokenizer  # noqa: PLC0415

        from whetstone.runtime.models import UnknownModel, resolve_model  # noqa: PLC0415

        try:
            location = resolve_model(ref, catalog).location
        except UnknownModel:
            location = ref if Path(ref).is_dir() else None
            if location is None:
                raise TokenizerUnavailable(f"base model {ref!r} is not a catalog name, a local directory "
                                           "or a reachable Hub id") from None
        try:
            tok = AutoTokenizer.from_pretrained(location)
        except Exception as exc:
            raise TokenizerUnavailable(f"the tokenizer of {ref!r} cannot be loaded: {type(exc).__name__}: "
                                       f"{str(exc)[:200]}") from exc
        if tok.pad_token is None and tok.eos_token is not None:
            tok.pad_token = tok.eos_token
        from whetstone.modelkit.vision import load_processor  # noqa: PLC0415

        try:
            processor = load_processor(location)
        except Exception as exc:
            raise TokenizerUnavailable(f"the image processor of {ref!r} cannot be loaded: {type(exc).__name__}: "
                                       f"{str(exc)[:200]}") from exc
        return cls(tok, ref, location, processor)

    def max_seq_len(self, policy_value: int | None) -> int:
        return policy_value or self.model_max_length or DEFAULT_MAX_SEQ_LEN

    # -- tokenization --------------------------------------------------------------

    @property
    def tool_support(self) -> bool:
        """Whether the chat template renders tool definitions, tool calls and tool results
        (probed once with a conversation that has all three)."""
        if self._tool_support is None:
            from whetstone.modelkit.chat import render_with_spans  # noqa: PLC0415

            try:
                text, _ = render_with_spans(self.tok, _PROBE, tools=_PROBE_TOOLS)
                self._tool_support = all(name in text for name in (_PROBE_TOOL, _PROBE_CALL, _PROBE_RESULT))
            except Exception:  # the template refuses the tool role, tool_calls, ...
                self._tool_support = False
        return self._tool_support

    def _check_tools(self, messages: list[dict], tools: list | None) -> None:
        if (tools or uses_tools(messages)) and not self.tool_support:
            raise ToolsUnsupported(f"the chat template of {self.ref!r} does not render tools, tool calls or tool "
                                   "messages; use a base model whose template supports tools, or remove tool rows")

    def _image_counts(self, sizes: list[tuple[int, int]]) -> list[int]:
        from whetstone.modelkit.vision import image_token_counts  # noqa: PLC0415

        return image_token_counts(self.processor, sizes)

    def _vision_messages(self, messages: list[dict]) -> tuple[list[dict], list[int] | None]:
        """Messages with images as the processor's image token, and each image's token count."""
        from whetstone.modelkit import vision  # noqa: PLC0415

        if not vision.has_images(messages):
            return messages, None
        if self.processor is None:
            raise ImagesUnsupported(f"the base model {self.ref!r} has no image processor: it cannot be trained on "
                                    "images; choose a vision-language base (whet models create-tiny --vision)")
        sizes = [vision.image_size(url) for url in vision.image_urls(messages)]
        return vision.text_messages(messages, self.image_token), self._image_counts(sizes)

    def _chat(self, messages: list[dict], tools: list | None = None) -> TokenSequence:
        from whetstone.modelkit.chat import tokenize_chat  # noqa: PLC0415
        from whetstone.modelkit.vision import expand_image_tokens  # noqa: PLC0415

        messages, counts = self._vision_messages(messages)
        self._check_tools(messages, tools)
        out = tokenize_chat(self.tok, messages, **({"tools": tools} if tools else {}))
        ids, labels = out["input_ids"], out["labels"]
        if counts:
            ids, labels = expand_image_tokens(ids, labels, self.image_token_id, counts)
        return TokenSequence(ids, labels)

    def _text(self, text: str) -> TokenSequence:
        ids = list(self.tok(text, add_special_tokens=True)["input_ids"])
        if self.tok.eos_token_id is not None and (not ids or ids[-1] != self.tok.eos_token_id):
            ids.append(self.tok.eos_token_id)
        return TokenSequence(ids, list(ids))

    def tokenize(self, out: NormalRow, max_len: int | None = None) -> Tokenized:
        """Token ids and labels of a normalized row; sequences cut to `max_len` when given.
        Raises ValueError (or the template's own error) when the row cannot be rendered."""
        if isinstance(out, ChatRow):
            seqs = {"": self._chat(out.messages, out.tools)}
        elif isinstance(out, PreferenceRow):
            seqs = {"chosen_": self._chat(out.prompt + out.chosen, out.tools),
                    "rejected_": self._chat(out.prompt + out.rejected, out.tools)}
        else:
            seqs = {"": self._text(out.text)}
        longest = max(len(s.input_ids) for s in seqs.values())
        record: dict[str, list[int]] = {}
        tokens = trained = 0
        for prefix, s in seqs.items():
            ids, labels = s.input_ids[:max_len], s.labels[:max_len]
            record[prefix + "input_ids"], record[prefix + "labels"] = ids, labels
            tokens += len(ids)
            trained += sum(1 for x in labels if x != _IGNORE)
        return Tokenized(tokens, longest, trained, record)

    def preview(self, out: NormalRow) -> str:
        """The row rendered with the chat template, trained tokens wrapped in [[ ]]."""
        from whetstone.modelkit.chat import mask_preview  # noqa: PLC0415

        kwargs = {"tools": out.tools} if out.tools else {}
        if isinstance(out, ChatRow):
            return mask_preview(self.tok, self._vision_messages(out.messages)[0], **kwargs)
        if isinstance(out, PreferenceRow):
            return mask_preview(self.tok, out.prompt + out.chosen, **kwargs)
        return f"[[{out.text}]]"
