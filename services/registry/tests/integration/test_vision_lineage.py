"""A vision adapter's registration on the real embedded stack: lineage records the processor and image
settings from the trainer's summary, the download lists the processor config beside the adapter, and
the model card shows both."""

import json

import httpx
import pytest

from whetstone.registry.adapters.store import ModelStore
from whetstone.registry.bootstrap import build_service
from whetstone.registry.usecases.handoff import materialise, vision_of

pytestmark = pytest.mark.integration
VISION = {"processor_class": "LlavaProcessor", "image_processor_class": "CLIPImageProcessor", "image_token": "<image>",
          "patch_size": 8, "vision_feature_select_strategy": "default", "size": {"shortest_edge": 32},
          "crop_size": {"height": 32, "width": 32}, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
          "vision_tower": "frozen", "packing": False, "images_trained": 24, "tokens_per_image": 16}


async def test_vision_lineage_download_model_card_and_vllm_handoff(platform, kit, tmp_path):
    processor = json.dumps({"processor_class": "LlavaProcessor", "image_token": "<image>", "patch_size": 8}).encode()
    preprocessor = json.dumps({"image_processor_type": "CLIPImageProcessor", "crop_size": VISION["crop_size"]}).encode()
    summary = json.dumps({"method": "lora", "packing": False, "vision": VISION}).encode()
    async with platform(build_service) as p:
        vision = await kit.register(p, "ftjob-vis", extra={"whetstone_training.json": summary,
                                                           "processor_config.json": processor,
                                                           "preprocessor_config.json": preprocessor})
        text = await kit.register(p, "ftjob-txt", extra={"whetstone_training.json": b'{"method": "lora"}'})
        async with httpx.AsyncClient(base_url=p.url("registry")) as c:
            lineage = (await c.get(f"/v1/models/{vision}", auth=kit.auth("demo"))).json()["lineage"]
            seen = lineage["vision"]
            assert (seen["processor_class"], seen["image_processor_class"], seen["image_size"], seen["patch_size"],
                    seen["tokens_per_image"], seen["image_token"], seen["vision_tower"]) == \
                ("LlavaProcessor", "CLIPImageProcessor", [32, 32], 8, 16, "<image>", "frozen")
            assert "image_mean" not in seen   # the processor config file carries the normalisation
            assert (await c.get(f"/v1/models/{text}", auth=kit.auth("demo"))).json()["lineage"]["vision"] is None

            listing = (await c.get(f"/v1/models/{vision}/content", auth=kit.auth("demo"))).json()
            names = [f["name"] for f in listing["files"]]
            assert {"processor_config.json", "preprocessor_config.json"} <= set(names)
            got = await c.get(f"/v1/models/{vision}/files/preprocessor_config.json", auth=kit.auth("demo"))
            assert got.status_code == 200 and got.content == preprocessor
            card = (await c.get(f"/v1/models/{vision}/files/README.md", auth=kit.auth("demo"))).text
            assert "pipeline_tag: image-text-to-text" in card and "## Vision" in card
            assert "`LlavaProcessor`" in card and "32 x 32 pixels; patch size 8" in card
            assert "tokens per image: 16" in card and "vision tower: frozen" in card
            text_card = (await c.get(f"/v1/models/{text}/files/README.md", auth=kit.auth("demo"))).text
            assert "## Vision" not in text_card and "image-text-to-text" not in text_card

        # the vLLM handoff lays the adapter out with the multimodal settings a server needs
        rt = p["registry"]
        for model_id in (vision, text):
            async with rt.uow() as uow:
                record = await ModelStore(uow.conn).get(model_id)
            materialise(rt.ctx.artifacts, record, tmp_path / "loras", await vision_of(rt, model_id))
        laid = tmp_path / "loras" / vision
        serve = json.loads((laid / "whetstone_vllm.json").read_text())
        assert serve["vision"] and serve["limit_mm_per_prompt"] == {"image": 10, "video": 0}
        assert serve["chat_template"] == str(laid / "chat_template.jinja") and (laid / "chat_template.jinja").is_file()
        assert (laid / "processor_config.json").read_bytes() == processor
        assert serve["command"][:3] == ["vllm", "serve", kit.BASE] and "--limit-mm-per-prompt" in serve["command"]
        assert serve["env"] == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        plain = json.loads((tmp_path / "loras" / text / "whetstone_vllm.json").read_text())
        assert not plain["vision"] and plain["limit_mm_per_prompt"] is None
        assert "--limit-mm-per-prompt" not in plain["command"] and not (tmp_path / "loras" / text /
                                                                        "processor_config.json").exists()
