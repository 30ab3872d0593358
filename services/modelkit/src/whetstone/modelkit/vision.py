"""Chats with images for a vision-language base: what ingest counts and what training feeds.

A normalised chat row keeps OpenAI's image parts in user contents
(`{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`). For the
platform's text rendering and masking (`whetstone.modelkit.chat`), each image becomes the
processor's image token in the text (`<image>` for LLaVA) and every image token is then
expanded to the number of tokens the processor inserts for that image (16 for the tiny
LLaVA); the expanded tokens are never trained (label -100), exactly as the processor lays
out `input_ids` before the model replaces them with image features.

Grey and palette images (L, LA, P, PA, 1) are converted here, when the image is opened for
training: to RGBA when they carry transparency, else to RGB (ingest accepted them and said so).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

IGNORE_INDEX = -100
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def is_vision_model(location: str | Path) -> bool:
    """A local model directory with an image processor (a Hub VLM's files)."""
    d = Path(location)
    return d.is_dir() and any((d / name).is_file() for name in PROCESSOR_FILES)


def load_processor(location: str | Path):
    """The model's processor (AutoProcessor) of a local directory or a Hub id, or None when it has no
    image processor."""
    from transformers import AutoProcessor  # noqa: PLC0415

    from .loading import is_local_ref  # noqa: PLC0415

    if is_local_ref(location) and not is_vision_model(location):
        return None

    processor = AutoProcessor.from_pretrained(str(location))
    return processor if getattr(processor, "image_processor", None) is not None else None


@dataclass(frozen=True)
class ImagePart:
    """One image of a chat: OpenAI's content part `{"type": "image_url", "image_url": {"url", "detail"?}}`,
    read once from the message list (that list stays in OpenAI's shape: it is what chat templates render)."""

    url: str
    detail: str = "auto"

    @classmethod
    def from_part(cls, part: Mapping[str, Any]) -> ImagePart:
        image = part["image_url"]
        return cls(url=image["url"], detail=image.get("detail", "auto"))


@dataclass(frozen=True)
class VisionTokens:
    """A chat with images tokenized for training, images not decoded: input_ids and labels (image tokens
    expanded, labels -100 on them) and the chat's images in order."""

    input_ids: list[int]
    labels: list[int]
    images: tuple[ImagePart, ...]


@dataclass(frozen=True)
class VisionExample:
    """A chat with images as the model trains on it: `VisionTokens` with the images' pixel values
    (a tensor, or None for a chat without images)."""

    input_ids: list[int]
    labels: list[int]
    pixel_values: Any


def has_images(messages: Sequence[Mapping[str, Any]]) -> bool:
    return any(type(m.get("content")) is list for m in messages)


def image_parts(messages: Sequence[Mapping[str, Any]]) -> list[ImagePart]:
    """The image parts of OpenAI-shaped messages, in order."""
    return [ImagePart.from_part(p) for m in messages if type(m.get("content")) is list
            for p in m["content"] if p.get("type") == "image_url"]


def image_urls(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    return [image.url for image in image_parts(messages)]


def text_messages(messages: Sequence[Mapping[str, Any]], image_token: str) -> list[dict[str, Any]]:
    """Messages whose content lists are strings again, each image written as `image_token`."""
    out = []
    for m in messages:
        content = m.get("content")
        if type(content) is list:
            text = "".join(image_token if p.get("type") in ("image_url", "image") else p.get("text", "")
                           for p in content)
            m = {**m, "content": text}
        out.append(dict(m))
    return out


def open_image(url: str):
    """A data URL's image as a PIL image in RGB or RGBA (grey and palette images converted)."""
    from PIL import Image  # noqa: PLC0415

    _, _, body = url.partition(",")
    im = Image.open(io.BytesIO(base64.b64decode(body)))
    im.load()
    if im.mode in ("RGB", "RGBA"):
        return im
    transparent = im.mode in ("LA", "PA") or (im.mode == "P" and "transparency" in im.info)
    return im.convert("RGBA" if transparent else "RGB")


def image_size(url: str) -> tuple[int, int]:
    """(height, width) of a data URL's image, from its header."""
    from PIL import Image  # noqa: PLC0415

    _, _, body = url.partition(",")
    with Image.open(io.BytesIO(base64.b64decode(body))) as im:
        return im.height, im.width


def image_token_counts(processor, sizes: Sequence[tuple[int, int]]) -> list[int]:
    """Tokens the processor inserts for images of these (height, width) sizes."""
    if not sizes:
        return []
    data = processor._get_num_multimodal_tokens(image_sizes=[list(s) for s in sizes])
    return list(data["num_image_tokens"])


def expand_image_tokens(ids: list[int], labels: list[int], image_token_id: int, counts: Sequence[int]
                        ) -> tuple[list[int], list[int]]:
    """Each occurrence of the image token repeated to its image's count (labels -100)."""
    if image_token_id not in ids:
        return ids, labels
    out_ids: list[int] = []
    out_labels: list[int] = []
    k = 0
    for tok, lab in zip(ids, labels):
        if tok == image_token_id and k < len(counts):
            out_ids += [tok] * counts[k]
            out_labels += [IGNORE_INDEX] * counts[k]
            k += 1
        else:
            out_ids.append(tok)
            out_labels.append(lab)
    return out_ids, out_labels


# ------------------------------------------------------------------ training building blocks

# LoRA on the language model only: the vision tower and the projector stay frozen (the default a
# vision recipe uses; `language_lora_targets(all_linear=True)` also takes the MLPs)
LANGUAGE_ATTENTION = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj)"
LANGUAGE_ALL_LINEAR = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def language_lora_targets(all_linear: bool = False) -> str:
    """peft `target_modules` as a regex (peft matches a string against the full module name)."""
    return LANGUAGE_ALL_LINEAR if all_linear else LANGUAGE_ATTENTION


def vision_tokens(processor, messages: Sequence[Mapping[str, Any]], max_len: int | None = None) -> VisionTokens:
    """`vision_example` without decoding the images (their sizes come from the headers), for a
    collator that decodes them per batch."""
    from .chat import tokenize_chat  # noqa: PLC0415

    tok = processor.tokenizer
    images = tuple(image_parts(messages))
    counts = image_token_counts(processor, [image_size(image.url) for image in images])
    out = tokenize_chat(tok, text_messages(messages, processor.image_token))
    image_id = tok.convert_tokens_to_ids(processor.image_token)
    ids, labels = expand_image_tokens(out["input_ids"], out["labels"], image_id, counts)
    if max_len is not None and len(ids) > max_len:
        if image_id in ids[max_len:]:
            raise ValueError(f"the row's images end after max_seq_len {max_len}; raise max_seq_len")
        ids, labels = ids[:max_len], labels[:max_len]
    return VisionTokens(input_ids=ids, labels=labels, images=images)


def pixel_values(processor, images: Sequence[ImagePart]):
    """The processor's pixel values of these data-URL images (None for none)."""
    if not images:
        return None
    return processor.image_processor([open_image(image.url) for image in images],
                                     return_tensors="pt")["pixel_values"]


def vision_example(processor, messages: Sequence[Mapping[str, Any]], max_len: int | None = None) -> VisionExample:
    """One chat with images as the model trains on it: input_ids and labels with the platform's mask
    (assistant turns; image tokens never trained), each image token expanded as the processor does,
    and the images' pixel values. Truncation never cuts an image (its tokens must all be there): a
    row whose images end past `max_len` raises ValueError."""
    tokens = vision_tokens(processor, messages, max_len)
    return VisionExample(input_ids=tokens.input_ids, labels=tokens.labels,
                         pixel_values=pixel_values(processor, tokens.images))


def load_vision_model(ref: str | Path, *, dtype: Any = "auto", **kwargs: Any):
    """AutoModelForImageTextToText for a local directory (checked like `loading.load_model`) or a Hub id."""
    import torch  # noqa: PLC0415
    from transformers import AutoModelForImageTextToText  # noqa: PLC0415

    from .loading import check_local_model_dir, is_local_ref  # noqa: PLC0415

    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    source = str(check_local_model_dir(ref)) if is_local_ref(ref) else str(ref)
    return AutoModelForImageTextToText.from_pretrained(source, dtype=dtype, **kwargs)


def is_vision_config(config) -> bool:
    """A transformers config of a vision-language model (it has a vision tower)."""
    return getattr(config, "vision_config", None) is not None


class VisionCollator:
    """Right-padded batches of `vision_example`s: input_ids, attention_mask, labels, pixel_values (all the
    batch's images in order). No packing: examples with images are never packed."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, examples: Sequence[VisionExample]) -> dict[str, Tensor]:
        import torch  # noqa: PLC0415

        width = max(len(e.input_ids) for e in examples)
        ids = torch.full((len(examples), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(examples), width), dtype=torch.long)
        for i, e in enumerate(examples):
            n = len(e.input_ids)
            ids[i, :n] = torch.tensor(e.input_ids)
            labels[i, :n] = torch.tensor(e.labels)
            mask[i, :n] = 1
        batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        pixels = [e.pixel_values for e in examples if e.pixel_values is not None]
        if pixels:
            batch["pixel_values"] = torch.cat([torch.as_tensor(p) for p in pixels])
        return batch
