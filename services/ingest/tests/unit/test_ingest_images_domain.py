"""The pure image rules: signatures, data URLs, the token estimate, image similarity, chat structure."""

from __future__ import annotations

import pytest

from whetstone.ingest.domain.chat import check_messages, normalize_messages, row_images
from whetstone.ingest.domain.images import (ImageFacts, ImageLimits, ImagePart, image_similarity, judge,
                                            openai_image_tokens, parse_data_url, sniff_format)
from whetstone.ingest.domain.normal import ChatRow
from whetstone.ingest.domain.rows import apply_pii
from whetstone.ingest.domain.schemas import canonical_text

pytestmark = pytest.mark.unit
URL = "data:image/png;base64,iVBORw0KGgo="


@pytest.mark.parametrize("head, fmt", [
    (b"\xff\xd8\xff\xe0rest", "JPEG"), (b"\x89PNG\r\n\x1a\nrest", "PNG"), (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "WEBP"),
    (b"GIF89a...", "GIF"), (b"BM....", "BMP"), (b"II*\x00", "TIFF"), (b"  <svg xmlns=...>", "SVG"),
    (b"<?xml version='1.0'?>", "SVG"), (b"hello", None),
])
def test_formats_are_named_by_their_signature(head, fmt):
    assert sniff_format(head) == fmt


def test_data_urls():
    assert parse_data_url("data:image/PNG;base64,AAAA") == ("image/png", "AAAA")
    assert "base64" in parse_data_url("data:image/png,AAAA")
    assert "comma" in parse_data_url("data:image/png;base64")


def test_rules_on_facts():
    limits = ImageLimits()
    facts = ImageFacts("PNG", "RGB", 10, 10, 100, "", 0)
    assert judge(facts, "image/png", limits, "m", 1) is None
    assert judge(facts, "", limits, "m", 1) is None                          # no media type: the bytes decide
    assert judge(facts, "image/jpeg", limits, "m", 1).code == "image_media_type_mismatch"
    assert judge(ImageFacts("PNG", "CMYK", 10, 10, 100, "", 0), "image/png", limits, "m", 1).code == \
        "image_mode_unsupported"
    assert judge(ImageFacts("PNG", "P", 10, 10, 100, "", 0), "image/png", limits, "m", 1) is None
    assert judge(ImageFacts("PNG", "RGB", 7000, 7000, 100, "", 0), "image/png", limits, "m", 1).code == \
        "image_too_many_pixels"


def test_openai_token_estimate():
    assert openai_image_tokens(4000, 4000, "low") == 85
    assert openai_image_tokens(512, 512, "auto") == 85 + 170
    assert openai_image_tokens(1024, 1024, "high") == 85 + 170 * 4      # 768 x 768: 2 x 2 tiles
    assert openai_image_tokens(2048, 4096, "high") == 85 + 170 * 6      # 1024 x 2048 -> 768 x 1536: 2 x 3


def test_image_similarity():
    assert image_similarity([], []) == 1.0
    assert image_similarity([0], []) == 0.0
    assert image_similarity([0b1111], [0]) == 1 - 4 / 64
    assert image_similarity([0, 0], [0, (1 << 64) - 1]) == 0.0


def _image(role="user", **image):
    return {"role": role, "content": [{"type": "text", "text": "look"},
                                      {"type": "image_url", "image_url": {"url": URL, **image}}]}


def test_chat_structure_with_images():
    a = {"role": "assistant", "content": "ok"}
    assert check_messages([_image(), a], 1, images=True) == []
    assert check_messages([_image(detail="low"), a], 1, images=True) == []
    assert [i.code for i in check_messages([_image(), a], 1)] == ["content_part_unsupported"]
    issues = check_messages([_image(detail="max"), a], 3, images=True)
    assert [(i.code, i.line, i.field) for i in issues] == [
        ("image_detail_invalid", 3, "messages[0].content[1].image_url.detail")]
    assert [i.code for i in check_messages([{"role": "user", "content": "q"}, _image("assistant")], 1,
                                           images=True)] == ["image_role"]


def test_normalised_image_rows_keep_their_parts_and_text_checks_see_marks():
    messages = normalize_messages([_image(detail="high", extra=1), {"role": "assistant", "content": "ok"}])
    assert messages[0]["content"] == [{"type": "text", "text": "look"},
                                      {"type": "image_url", "image_url": {"url": URL, "detail": "high"}}]
    assert row_images(messages) == [ImagePart(message=0, part=1, url=URL, detail="high")]
    assert canonical_text({"messages": messages}) == "look\n<image>\nok"
    # PII is scanned and redacted in text parts only, never in the image data
    messages[0]["content"][0]["text"] = "mail me at jane.doe@example.com"
    found = apply_pii(ChatRow(messages), "redact")
    assert found.counts == {"email": 1}
    redacted = found.row.messages[0]["content"]
    assert "jane.doe" not in redacted[0]["text"] and redacted[1]["image_url"]["url"] == URL
