"""Images in chat requests on the real embedded stack, with the official `openai` client: a LoRA adapter
on the tiny LLaVA answers an image part exactly as PEFT's own generate does with the processor's
inputs, and the images training would refuse are refused here with ingest's codes, naming the part."""

import base64
import io
import struct
import zlib

import httpx
import openai
import pytest
from PIL import Image

from whetstone.devstack.serving_samples import promoted, registered, store_adapter
from whetstone.devstack.testing import send_event, wait_until
from whetstone.runtime.identity import IdentityAuth
from whetstone.runtime.models import weights_sha256
from whetstone.runtime.s3 import ObjectStore
from whetstone.serving.bootstrap import build_service
from whetstone.serving.config import ServingSettings

pytestmark = pytest.mark.integration
BASE = "tiny-llava"


def data_url(image: Image.Image, fmt: str = "PNG", media: str = "image/png") -> str:
    buf = io.BytesIO()
    image.save(buf, fmt)
    return f"data:{media};base64,{base64.b64encode(buf.getvalue()).decode()}"


def huge_png(width: int = 30_000, height: int = 30_000) -> str:
    """A PNG of a few bytes whose header says width x height (a decompression bomb's header)."""
    buf = io.BytesIO()
    Image.new("1", (1, 1)).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    ihdr = bytearray(data[12:29])     # b"IHDR" + 13 bytes of fields
    ihdr[4:12] = struct.pack(">II", width, height)
    data[12:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)))
    return f"data:image/png;base64,{base64.b64encode(bytes(data)).decode()}"


def ask(url: str, role: str = "user") -> list[dict]:
    parts = [{"type": "text", "text": "Which colour is this? "}, {"type": "image_url", "image_url": {"url": url}}]
    if role == "user":
        return [{"role": "user", "content": parts}]
    return [{"role": "user", "content": "Look."}, {"role": role, "content": parts}]


@pytest.fixture(scope="module")
def vision_base(tmp_path_factory):
    from whetstone.modelkit.tiny_vision import build_tiny_vision_model

    return build_tiny_vision_model(tmp_path_factory.mktemp("vision-base") / BASE, seed=0)


def vision_adapter(base_dir, out_dir):
    """A random (non-zero) LoRA on the tiny LLaVA's language model, saved with the processor."""
    import torch
    from peft import LoraConfig, get_peft_model

    from whetstone.modelkit.vision import language_lora_targets, load_processor, load_vision_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = get_peft_model(load_vision_model(base_dir, dtype="float32"),
                               LoraConfig(r=4, lora_alpha=8, target_modules=language_lora_targets(),
                                          init_lora_weights=False))
    model.save_pretrained(str(out_dir))
    load_processor(base_dir).save_pretrained(str(out_dir))
    return out_dir


def reference_answer(base_dir, adapter_dir, image: Image.Image, max_new_tokens: int = 6) -> str:
    """PEFT's greedy answer, the prompt built by the processor itself (its own image-token expansion)."""
    import torch
    from peft import PeftModel

    from whetstone.modelkit.vision import load_processor, load_vision_model

    processor = load_processor(base_dir)
    model = PeftModel.from_pretrained(load_vision_model(base_dir, dtype="float32"), str(adapter_dir)).eval()
    text = processor.tokenizer.apply_chat_template([{"role": "user", "content": "Which colour is this? <image>"}],
                                                   tokenize=False, add_generation_prompt=True)
    inputs = processor(text=text, images=[image], return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


async def test_image_parts_answered_by_a_vision_adapter_and_bad_images_refused(platform, settings, vision_base,
                                                                               tmp_path):
    settings.model_catalog.mkdir(parents=True, exist_ok=True)
    (settings.model_catalog / BASE).symlink_to(vision_base, target_is_directory=True)
    sha = weights_sha256(vision_base)
    adapter_dir = vision_adapter(vision_base, tmp_path / "adapter")
    store = ObjectStore(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, settings.bucket)
    adapter = store_adapter(store, adapter_dir, "demo", "wsm-vis", "ft:tiny-llava:demo:colours")
    await send_event(settings.kafka_bootstrap, registered(adapter, base_model=BASE, base_sha256=sha), "demo")
    await send_event(settings.kafka_bootstrap, promoted(adapter, "dev", "staging", base_model=BASE, base_sha256=sha,
                                                        sequence=1), "demo")
    red = Image.new("RGB", (40, 30), (220, 20, 20))
    config = ServingSettings(http_port=0, base_model=BASE, max_resident_adapters=2, max_images_per_request=3)
    async with platform(lambda: build_service(config)) as p:
        demo = openai.AsyncOpenAI(base_url=p.url("serving") + "/v1", api_key="unused", max_retries=0,
                                  http_client=httpx.AsyncClient(auth=IdentityAuth("demo", ("read",)), timeout=60))
        await wait_until(lambda: _staging(p["serving"]), 30, "projection in memory")

        reply = await demo.chat.completions.create(model=adapter.name, messages=ask(data_url(red)), max_tokens=6,
                                                   temperature=0)
        want = reference_answer(vision_base, adapter_dir, red)
        assert reply.choices[0].message.content == want, (reply.choices[0].message.content, want)
        # 16 image tokens for the one image, beside the text's
        assert reply.usage.prompt_tokens > 16
        # the adapter's weights took part: the base alone answers otherwise
        base = await demo.chat.completions.create(model=BASE, messages=ask(data_url(red)), max_tokens=6, temperature=0)
        assert base.choices[0].message.content != want
        # the same image in grey (mode L) is converted as in training; the base answers images too
        grey = await demo.chat.completions.create(model=BASE, messages=ask(data_url(red.convert("L"))), max_tokens=2,
                                                  temperature=0)
        assert grey.choices[0].finish_reason in ("stop", "length")

        async def refused(messages) -> openai.BadRequestError:
            with pytest.raises(openai.BadRequestError) as err:
                await demo.chat.completions.create(model=adapter.name, messages=messages, max_tokens=2)
            return err.value

        at = "messages[0].content[1].image_url.url"
        jpeg = data_url(red, "JPEG", "image/jpeg")
        gif = data_url(red.convert("P"), "GIF", "image/gif")
        bomb = huge_png()
        cases = [
            (ask("https://169.254.169.254/latest/meta-data.png"), "image_url_refused", at),
            (ask("http://127.0.0.1/cat.png"), "image_url_refused", at),
            (ask(jpeg.replace("image/jpeg", "image/png")), "image_media_type_mismatch", at),
            (ask(gif), "image_format_unsupported", at),
            (ask(data_url(red.convert("CMYK"), "JPEG", "image/jpeg")), "image_mode_unsupported", at),
            (ask(bomb), "image_too_many_pixels", at),
            (ask(jpeg[:60] + "!!garbage!!" + jpeg[60:]), "image_bad_base64", at),
            (ask(jpeg, role="assistant"), "image_role", "messages[1].content[1]"),
            ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": jpeg}}] * 4}],
             "too_many_images", "messages"),
        ]
        for messages, code, param in cases:
            err = await refused(messages)
            assert (err.code, err.body.get("param")) == (code, param), (code, err.body)
        err = await refused([{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": jpeg, "detail": "ultra"}}]}])
        assert err.code == "image_detail_invalid" and "auto, low, high" in err.message
        # the text may not smuggle the image token in without an image
        err = await refused([{"role": "user", "content": "what is <image> ?"}])
        assert err.code == "invalid_messages" and "image token" in err.message


async def _staging(rt) -> bool:
    return any(v.stage == "staging" for v in rt.ctx.catalog.versions.values())
