"""Vision-language supervised fine-tuning, read top to bottom: setup -> train -> save_checkpoint -> cleanup.

    lora, qlora   chat SFT on image+text chats (OpenAI's `image_url` data-URL parts in user turns)

Chosen by `main.py` instead of `sft.py` when the base model sees images (a vision config, or a
local directory with an image processor) or the training file holds image parts. The base loads
with AutoModelForImageTextToText and its AutoProcessor; a file with images and a text-only base
is refused (`model_cannot_see_images`), as the scheduler refuses it at admission.

- Masking: the platform's assistant-only mask (`whetstone.modelkit.chat`); each image is the
  processor's image token, expanded to the tokens the processor inserts for it, never trained
  (`whetstone.modelkit.vision.vision_tokens`). Truncation never cuts an image: a row whose images
  end past max_seq_len is refused naming its line.
- Images are decoded per micro-batch by the collator (the processor's pixel values), not held in
  memory for the whole file.
- Packing is off (examples with images are never packed): `packing` is false in the resolved
  hyperparameters the run reports, whatever the request said.
- LoRA on the language model only, by default: the vision tower and the multimodal projector stay
  frozen (and unquantized under QLoRA). `lora_target_modules` picks the language model's layers
  by leaf name (default: all its linear layers). `train_vision_tower: true` also adapts every
  linear layer of the vision tower and the projector.
- Checkpoints, exact resume, SIGTERM, OOM retries, progress and checkpoint events, validation at
  each checkpoint: the same `session`, `trainers` and `callbacks` as the text recipe. The final
  artifact saves the processor (image processor config, tokenizer, chat template) beside the
  adapter, and `whetstone_training.json` records the image settings under "vision".
- Not offered for images (refused with the reason): full, cpt, dpo, orpo, reinforcement, merge_adapter.
"""

from __future__ import annotations

import binascii
import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..domain.recipe_io import Outcome, Validation
from .data import IGNORE_INDEX, TokenCounter
from .errors import UserError
from .faults import Faults
from .hyperparams import Hyperparameters
from .modeling import _base_model_errors
from .protocol import EventStream, PreemptionFlag
from .rows import ChatMessage, ChatRow
from .session import TrainingSession
from .spec import RecipeConfig
from .trainers import install_sft_trainer
from .validation import Validator

if TYPE_CHECKING:
    from whetstone.modelkit.vision import ImagePart

log = logging.getLogger("whetstone.trainer_agent.recipes")

METHODS = ("lora", "qlora")
# module names of the parts that see the image (LLaVA, Qwen-VL, Idefics/SmolVLM, mllama, ...): frozen by default
VISION_PARTS = ("vision_tower", "vision_model", "visual", "multi_modal_projector", "mm_projector", "connector")
IMAGE_MARK = b'"image_url"'


# ------------------------------------------------------------------ routing (main.py)


def base_sees_images(ref: str) -> bool:
    """A local directory with an image processor, or a config with a vision tower."""
    from whetstone.modelkit.vision import is_vision_config, is_vision_model

    from .modeling import load_base_config

    return is_vision_model(ref) or is_vision_config(load_base_config(ref))


def file_has_images(path: Path) -> bool:
    """Whether any line of a JSONL file holds an image part (a byte scan; stops at the first)."""
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return any(IMAGE_MARK in line for line in f)


def is_vision_job(cfg: RecipeConfig) -> bool:
    return base_sees_images(cfg.base_model) or file_has_images(cfg.train_file)


# ------------------------------------------------------------------ the recipe


@dataclass(frozen=True)
class ImageChatExample:
    """One tokenized image chat (`whetstone.modelkit.vision.VisionTokens`) and its source line: what the
    trainer's dataset holds; the collator decodes the images per micro-batch."""

    input_ids: list[int]
    labels: list[int]
    images: tuple[ImagePart, ...]
    line: int


class VisionSFTRecipe:
    """setup -> train -> save_checkpoint -> cleanup, for lora / qlora on a vision-language base."""

    def __init__(self, cfg: RecipeConfig, events: EventStream, preemption: PreemptionFlag,
                 faults: Faults | None = None) -> None:
        self.session = TrainingSession(cfg, events, preemption, faults, packing=False, vision=True)
        self.processor = None
        self.counter = TokenCounter()
        self.examples: list[ImageChatExample] = []
        self.validation_examples: list[ImageChatExample] | None = None

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Cheap checks first (user errors fail fast), then processor, data, model, trainer."""
        session, cfg = self.session, self.session.cfg
        _check_method(cfg, session.hp)
        session.hp = _without_packing(session.hp)
        train_rows, validation_rows = session.read_inputs()
        self.processor = _load_processor(cfg)
        _check_text_context(cfg.base_model, session.hp.max_seq_len)
        session.tokenizer = self.processor  # the final artifact saves the processor (tokenizer included)
        self.examples = self._tokenize(train_rows, cfg.train_file.name)
        if validation_rows is not None:
            self.validation_examples = self._tokenize(validation_rows, cfg.validation_file.name)
        model = session.load_model([len(e.input_ids) for e in self.examples])
        session.hp = _without_packing(session.hp)
        self._build_trainer(model)

    def rebuild(self, hp: Hyperparameters) -> None:
        """A fresh model and trainer with other batch geometry (after an out-of-memory error)."""
        self._build_trainer(self.session.reload_model(hp))

    def _tokenize(self, rows: list[tuple[int, ChatRow]], name: str) -> list[ImageChatExample]:
        from whetstone.modelkit.chat import ChatFormatError
        from whetstone.modelkit.vision import vision_tokens

        examples, dropped = [], []
        for line_no, chat in rows:
            where = f"{name} line {line_no}"
            if chat.tools:
                raise UserError(f"{where}: tools are not supported in vision fine-tuning", code="bad_example")
            _check_image_parts(chat.messages, where)
            try:
                tokens = vision_tokens(self.processor, chat.template_messages(), self.session.hp.max_seq_len)
            except ChatFormatError as exc:
                raise UserError(f"{where}: {exc}", code="bad_example") from exc
            except (OSError, binascii.Error, ValueError) as exc:  # undecodable image, images past max_seq_len
                raise UserError(f"{where}: {exc}", code="bad_example") from exc
            if any(label != IGNORE_INDEX for label in tokens.labels[1:]):
                examples.append(ImageChatExample(input_ids=tokens.input_ids, labels=tokens.labels,
                                                 images=tokens.images, line=line_no))
            else:
                dropped.append(line_no)
        if dropped:
            log.warning("%s: %d rows have no trained tokens within max_seq_len=%d (lines %s...)",
                        name, len(dropped), self.session.hp.max_seq_len, dropped[:10])
        if not examples:
            raise UserError(f"{name}: no row has trained tokens within max_seq_len={self.session.hp.max_seq_len}",
                            code="empty_dataset")
        return examples

    def _build_trainer(self, model) -> None:
        from peft import get_peft_model
        from transformers import set_seed

        session, cfg, hp = self.session, self.session.cfg, self.session.hp
        set_seed(hp.seed)  # LoRA init
        model = get_peft_model(model, vision_lora_config(model, hp))
        poison = session.faults.poison(model.get_input_embeddings().num_embeddings)
        collator = ImageChatCollator(self.processor, cfg.train_file.name, self.counter, poison)
        install_sft_trainer(session, model, train_dataset=self.examples, collator=collator,
                            processing_class=self.processor, validator=self._validator(),
                            examples_by_line={e.line: [e] for e in self.examples})  # one example per line

    def _validator(self) -> Validator | None:
        if self.validation_examples is None:
            return None
        collator = ImageChatCollator(self.processor, self.session.cfg.validation_file.name)
        return vision_validator(self.validation_examples, collator, batch_size=int(self.session.hp.batch_size))

    # ------------------------------------------------------------------ train (session.train)

    def validation(self) -> Validation | None:
        validate = self._validator()
        return validate(self.session.trainer.model) if validate else None

    def outcome(self) -> Outcome:
        """What this method adds to the `completed` event."""
        return Outcome(non_padding_fraction=round(self.counter.non_padding_fraction, 6) if self.counter.computed
                       else None, images=sum(len(e.images) for e in self.examples))

    # ------------------------------------------------------------------ save_checkpoint

    def save_checkpoint(self) -> Path:
        """output_dir/final: adapter, processor, summary (with the image settings), loss curve."""
        return self.session.save_final(merge=False, non_padding_fraction=self.counter.non_padding_fraction,
                                       vision=self.image_settings())

    def image_settings(self) -> ImageSettings:
        """What a server needs to feed images as in training: the processor and its image settings."""
        return image_settings(self.processor, train_vision_tower=self.session.hp.train_vision_tower,
                              images=sum(len(e.images) for e in self.examples))

    # ------------------------------------------------------------------ cleanup (session.cleanup)


# ------------------------------------------------------------------ components


def _check_method(cfg: RecipeConfig, hp: Hyperparameters) -> None:
    if cfg.method not in METHODS:
        raise UserError(f"method '{cfg.method}' does not train on images or vision-language bases yet; "
                        f"use {' or '.join(METHODS)}", code="unsupported_method")
    if hp.merge_adapter:
        raise UserError("merge_adapter is not supported for vision-language bases yet; load the adapter on the base",
                        code="invalid_hyperparameters")


def _without_packing(hp: Hyperparameters) -> Hyperparameters:
    if hp.packing and "packing" in hp.explicit:
        log.warning("packing=true ignored: examples with images are never packed")
    return replace(hp, packing=False)


def _load_processor(cfg: RecipeConfig):
    from whetstone.modelkit.vision import load_processor

    with _base_model_errors():
        processor = load_processor(cfg.base_model)
    if processor is None:
        raise UserError(f"training file {cfg.train_file.name} has images, but base model {cfg.base_model!r} is "
                        "text-only (no image processor); choose a vision-language base model",
                        code="model_cannot_see_images")
    return processor


def _check_text_context(ref: str, max_seq_len: int) -> None:
    from .modeling import check_sequence_length, load_base_config

    config = load_base_config(ref)
    check_sequence_length(getattr(config, "text_config", None) or config, max_seq_len)


def _check_image_parts(messages: list[ChatMessage], where: str) -> None:
    """Images are data URLs in user turns (ingest stores what it fetched as data URLs)."""
    for i, message in enumerate(messages):
        if not isinstance(message.content, list):
            continue
        for j, part in enumerate(message.content):
            if part.type not in ("text", "image_url"):
                raise UserError(f"{where}: message {i} content[{j}] must be a text or image_url part",
                                code="bad_example")
            if part.type != "image_url":
                continue
            if message.role != "user":
                raise UserError(f"{where}: message {i} ({message.role}) has an image; images go in user "
                                "messages only", code="bad_example")
            url = part.image_url.url if part.image_url else None
            if url is None or not url.startswith("data:image/"):
                raise UserError(f"{where}: message {i} content[{j}] image_url.url must be a data:image/... URL",
                                code="bad_example")


def vision_lora_config(model, hp: Hyperparameters):
    """LoRA on the language model's linear layers (by default all, else `lora_target_modules` by leaf name);
    the vision parts are excluded unless `train_vision_tower`."""
    import torch
    from peft import LoraConfig

    head = model.get_output_embeddings()
    linears = {name: module for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and module is not head}
    linears |= {name: module for name, module in model.named_modules()
                if type(module).__name__ in ("Linear4bit", "Linear8bitLt") and module is not head}
    parts = re.compile(r"(^|\.)(" + "|".join(VISION_PARTS) + r")(\.|$)")
    chosen = linears if hp.train_vision_tower else {n: m for n, m in linears.items() if not parts.search(n)}
    available = sorted({name.rsplit(".", 1)[-1] for name in chosen})
    if not available:
        raise UserError("the base model has no linear layer LoRA can adapt outside its vision tower",
                        code="invalid_hyperparameters")
    targets = list(hp.lora_target_modules or available)
    missing = sorted(set(targets) - set(available))
    if missing:
        raise UserError(f"lora_target_modules: the language model has no linear module named {', '.join(missing)} "
                        f"(available: {', '.join(available)})", code="invalid_hyperparameters")
    adapted = [m for n, m in chosen.items() if n.rsplit(".", 1)[-1] in targets]
    smallest = min(min(m.in_features, m.out_features) for m in adapted)
    if hp.lora_r > smallest:
        raise UserError(f"lora_r={hp.lora_r} exceeds the smallest dimension ({smallest}) of the adapted layers",
                        code="invalid_hyperparameters")
    exclude = None if hp.train_vision_tower else r".*\b(" + "|".join(VISION_PARTS) + r")\b.*"
    return LoraConfig(r=hp.lora_r, lora_alpha=hp.lora_alpha, lora_dropout=hp.lora_dropout, target_modules=targets,
                      exclude_modules=exclude, bias="none", task_type="CAUSAL_LM")


class ImageChatCollator:
    """Right-padded micro-batches of tokenized image chats; each example's images are decoded here into the
    processor's pixel values (`whetstone.modelkit.vision.VisionCollator`). No packing."""

    def __init__(self, processor, data_name: str, counter: TokenCounter | None = None, poison=None) -> None:
        from whetstone.modelkit.vision import VisionCollator

        self.processor = processor
        self.data_name = data_name
        self.counter = counter or TokenCounter()
        self.poison = poison  # test-only fault hook (faults.py)
        self.pad = VisionCollator(processor.tokenizer.pad_token_id or 0)

    def __call__(self, features: list[ImageChatExample]) -> dict[str, Any]:
        import torch
        from whetstone.modelkit.vision import VisionExample, pixel_values

        rows = []
        for f in features:
            try:
                pixels = pixel_values(self.processor, f.images)
            except (OSError, binascii.Error, ValueError) as exc:
                raise UserError(f"{self.data_name} line {f.line}: an image could not be decoded ({exc})",
                                code="bad_example") from exc
            rows.append(VisionExample(input_ids=self.poison(f.input_ids, f.line) if self.poison else f.input_ids,
                                      labels=f.labels, pixel_values=pixels))
        batch = self.pad(rows)
        self.counter.real += int(batch["attention_mask"].sum())
        self.counter.computed += batch["input_ids"].numel()
        batch["example_lines"] = torch.tensor([f.line for f in features], dtype=torch.long)
        return batch


def vision_validator(examples: list[ImageChatExample], collator: ImageChatCollator, *, batch_size: int
                     ) -> Validator:
    """Loss and token accuracy on the trained tokens of held-out image chats (masked as for training)."""

    def batches():
        for i in range(0, len(examples), batch_size):
            batch = collator(examples[i:i + batch_size])
            batch.pop("example_lines")
            yield batch

    def validate(model: Any) -> Validation:
        from whetstone.modelkit.holdout import labelled_loss_sums

        sums = labelled_loss_sums(model, batches())
        return Validation(loss=sums.loss / max(sums.tokens, 1), tokens=sums.tokens,
                          mean_token_accuracy=sums.correct / max(sums.tokens, 1))

    return validate


@dataclass(frozen=True)
class ImageSettings:
    """The processor and image settings of a vision adapter (lineage, serving), as `whetstone_training.json`
    records them under "vision"."""

    processor_class: str
    image_processor_class: str
    image_token: str | None
    patch_size: int | None
    vision_feature_select_strategy: str | None
    size: Any                       # the image processor's settings as plain JSON values
    crop_size: Any
    image_mean: Any
    image_std: Any
    vision_tower: str               # "lora" or "frozen"
    packing: bool
    images_trained: int
    tokens_per_image: int | None    # None when the processor cannot say


def image_settings(processor, *, train_vision_tower: bool, images: int) -> ImageSettings:
    """The processor and image settings of a vision adapter: classes, image size, image token and tokens
    per image, normalisation, and what was trained."""
    image_processor = processor.image_processor
    crop_size = _plain(getattr(image_processor, "crop_size", None))
    try:
        crop = crop_size or {}
        size = (int(crop["height"]), int(crop["width"]))
        tokens_per_image = int(processor._get_num_multimodal_tokens(image_sizes=[list(size)])["num_image_tokens"][0])
    except (KeyError, TypeError, ValueError, AttributeError, NotImplementedError):
        tokens_per_image = None
    return ImageSettings(
        processor_class=type(processor).__name__,
        image_processor_class=type(image_processor).__name__,
        image_token=getattr(processor, "image_token", None),
        patch_size=getattr(processor, "patch_size", None),
        vision_feature_select_strategy=getattr(processor, "vision_feature_select_strategy", None),
        size=_plain(getattr(image_processor, "size", None)),
        crop_size=crop_size,
        image_mean=_plain(getattr(image_processor, "image_mean", None)),
        image_std=_plain(getattr(image_processor, "image_std", None)),
        vision_tower="lora" if train_vision_tower else "frozen",
        packing=False,
        images_trained=images,
        tokens_per_image=tokens_per_image,
    )


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "items"):  # transformers' SizeDict
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return {k: _plain(v) for k, v in vars(value).items() if v is not None} if hasattr(value, "__dict__") else str(value)
