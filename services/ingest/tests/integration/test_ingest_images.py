"""Image parts through the data gate on real files: accepted images counted, every bad image refused
with its line and part, duplicates over images, image tokens for a vision base, a text-only base refused."""

from __future__ import annotations

import base64
import io
import json
import random
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from whetstone.ingest.adapters.tokenizer import BaseModelTokenizer
from whetstone.ingest.config import IngestSettings

pytestmark = pytest.mark.integration


def picture(seed: int, size: tuple[int, int] = (48, 48), mode: str = "RGB") -> Image.Image:
    """A generated picture: a shape at a place that depends on `seed` (no two seeds alike)."""
    im = Image.new("RGB", size, ((seed * 53) % 256, (seed * 97) % 256, (seed * 31) % 256))
    d = ImageDraw.Draw(im)
    x, y = (seed * 7) % (size[0] - 16), (seed * 13) % (size[1] - 16)
    d.rectangle([x, y, x + 15, y + 15], fill=(255 - (seed * 53) % 256, (seed * 11) % 256, 200))
    d.ellipse([size[0] - x - 12, size[1] - y - 12, size[0] - x, size[1] - y], fill=(seed % 256, 0, 255))
    return im.convert(mode) if mode != "RGB" else im


def encode(im: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def part(url: str, detail: str | None = None) -> dict:
    image = {"url": url, **({"detail": detail} if detail else {})}
    return {"type": "image_url", "image_url": image}


def image_row(url: str, question: str = "What is drawn here?", answer: str = "a square and a circle",
              detail: str | None = None) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": question}, part(url, detail)]},
                         {"role": "assistant", "content": answer}]}


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (1-bit grey) over a few bytes of data: a decompression bomb."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + \
        chunk(b"IEND", b"")


def good_image_rows(n: int, start: int = 0) -> list[dict]:
    return [image_row(data_url(encode(picture(i))), question=f"Picture {i}: what is drawn here?",
                      answer=f"shapes number {i}") for i in range(start, start + n)]


def report_of(kit, tmp_path: Path, rows: list, **kw) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    result = kit.run_gate(kit.write_jsonl(tmp_path / "d.jsonl", rows), tmp_path, **kw)
    r = result.report.as_dict()
    r["_result"] = result
    return r


def by_line(r: dict) -> dict[int | None, list[dict]]:
    out: dict[int | None, list[dict]] = {}
    for e in r["errors"]:
        out.setdefault(e["line"], []).append(e)
    return out


def test_accepted_images_are_checked_counted_and_kept_in_the_output(tmp_path, kit):
    rgba = picture(101, mode="RGBA")
    grey = picture(102, mode="L")
    palette = picture(103).convert("P", palette=Image.Palette.ADAPTIVE)
    rows = good_image_rows(10) + [
        image_row(data_url(encode(picture(100), "JPEG", quality=90), "image/jpeg"), "Picture 100?", "jpeg",
                  detail="low"),
        image_row(data_url(encode(rgba), "image/png"), "Picture 101?", "rgba", detail="high"),
        image_row(data_url(encode(grey), "image/png"), "Picture 102?", "grey"),
        image_row(data_url(encode(palette, "PNG"), "image/png"), "Picture 103?", "palette"),
        image_row(data_url(encode(picture(104), "WEBP"), "image/webp"), "Picture 104?", "webp"),
        # two images, the user's text after them; an image alone is content enough
        {"messages": [{"role": "system", "content": "You describe pictures."},
                      {"role": "user", "content": [part(data_url(encode(picture(105)))),
                                                   part(data_url(encode(picture(106))))]},
                      {"role": "assistant", "content": "two pictures"}]},
        *kit.good_rows(4),                                   # text rows beside image rows
    ]
    r = report_of(kit, tmp_path, rows)
    assert r["accepted"], r["errors"]
    images = r["images"]
    assert images["images"] == images["images_read"] == 17 and images["rows_with_images"] == 16
    assert images["images_refused"] == 0
    assert images["by_format"] == {"PNG": 14, "JPEG": 1, "WEBP": 1} or images["by_format"] == {
        "PNG": 15, "JPEG": 1, "WEBP": 1}
    assert sum(images["by_format"].values()) == 17
    assert images["by_mode"]["L"] == 1 and images["by_mode"]["P"] == 1 and images["by_mode"]["RGBA"] == 1
    assert images["converted"] == 2 and images["by_detail"] == {"auto": 15, "low": 1, "high": 1}
    assert images["image_tokens"] == 85 * 1 + 255 * 16       # low: 85; a small image: one tile
    assert "images_converted" in r["warning_counts"]
    converted = next(w for w in r["warnings"] if w["code"] == "images_converted")["message"]
    assert "L x1" in converted and "P x1" in converted
    out = kit.read_jsonl(r["_result"].train_path) + kit.read_jsonl(r["_result"].validation_path)
    kept = [row for row in out if isinstance(row["messages"][0]["content"], list)
            or isinstance(row["messages"][-2]["content"], list)]
    assert len(kept) == 16
    first = next(row for row in out if row["messages"][-1]["content"] == "jpeg")
    assert first["messages"][0]["content"][1] == part(rows[10]["messages"][0]["content"][1]["image_url"]["url"],
                                                      "low")
    # the estimate counts image tokens: the image rows' tokens exceed their text's
    assert r["tokens_total"] > images["image_tokens"]


def test_text_only_files_have_no_image_section(tmp_path, kit):
    r = report_of(kit, tmp_path, kit.good_rows(12))
    assert r["accepted"] and r["images"] is None


def test_every_bad_image_is_refused_with_its_line_and_part(tmp_path, kit):
    jpeg = encode(picture(1), "JPEG")
    png = encode(picture(2))
    cmyk = encode(picture(3).convert("CMYK"), "JPEG")
    gif = encode(picture(4), "GIF")
    bmp = encode(picture(5), "BMP")
    svg = b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"></svg>'
    big = b"\x89PNG\r\n\x1a\n" + bytes(12 * 1024 ** 2)
    b64 = base64.b64encode(png).decode()
    garbage = "data:image/png;base64," + b64[:40] + "!!not base64!!" + b64[40:]
    tiny = data_url(encode(Image.new("RGB", (2, 2), "red")))
    u = {"role": "user", "content": "q"}
    bad = [
        (image_row(data_url(b"\x89PNG\r\n\x1a\n" + jpeg)), "image_undecodable"),               # 1 PNG header, JPEG
        (image_row(data_url(png_header(30_000, 30_000))), "image_too_many_pixels"),            # 2 30k x 30k
        (image_row(data_url(png_header(7_000, 7_000))), "image_too_many_pixels"),              # 3 over our cap
        (image_row(data_url(big)), "image_too_large"),                                         # 4 12 MB
        (image_row(data_url(gif, "image/gif")), "image_format_unsupported"),                   # 5 GIF
        (image_row(data_url(svg, "image/svg+xml")), "image_format_unsupported"),               # 6 SVG
        (image_row(data_url(bmp, "image/bmp")), "image_format_unsupported"),                   # 7 BMP
        (image_row(data_url(cmyk, "image/jpeg")), "image_mode_unsupported"),                   # 8 CMYK JPEG
        (image_row(garbage), "image_bad_base64"),                                              # 9 garbage base64
        ({"messages": [u, {"role": "assistant", "content": [part(tiny)]}]}, "image_role"),     # 10 assistant image
        ({"messages": [{"role": "user", "content": [part(tiny)] * 100},
                       {"role": "assistant", "content": "a"}]}, "too_many_images"),          # 11 100 images
        (image_row("https://127.0.0.1/cat.png"), "image_url_refused"),                        # 12 loopback URL
        (image_row("http://169.254.169.254/latest/meta-data/"), "image_url_refused"),         # 13 metadata URL
        (image_row(tiny, detail="ultra"), "image_detail_invalid"),                             # 14 detail
        (image_row(data_url(jpeg, "image/png")), "image_media_type_mismatch"),                 # 15 says png, is jpeg
        (image_row(data_url(png[: len(png) // 2])), "image_undecodable"),                      # 16 truncated
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]},
                       {"role": "assistant", "content": "a"}]}, "image_part_invalid"),         # 17 not an object
        ({"messages": [{"role": "system", "content": [part(tiny)]}, u,
                       {"role": "assistant", "content": "a"}]}, "image_role"),                 # 18 system image
        (image_row("file:///etc/passwd"), "image_url_refused"),                                # 19 not data/https
        (image_row(data_url(png, "image/tiff")), "image_media_type_mismatch"),                 # 20 odd media type
        (image_row(data_url(png_header(0, 5))), "image_too_many_pixels"),                      # 21 no pixels
    ]
    rows = [row for row, _ in bad] + good_image_rows(12)
    r = report_of(kit, tmp_path, rows)
    got = by_line(r)
    assert not r["accepted"]
    for line, (_, code) in enumerate(bad, start=1):
        assert line in got, (line, code)
        if code == "image_too_many_pixels" and line == 21:
            code = "image_undecodable"      # a PNG of 0 x 5 pixels: Pillow refuses the header itself
        assert [e["code"] for e in got[line]] == [code], (line, got[line])
    # the part is named: the message and its content index
    assert got[1][0]["field"] == "messages[0].content[1]" and got[10][0]["field"] == "messages[1].content[0]"
    assert "assistant" in got[10][0]["message"] and "900,000,000 pixels exceeds" in got[2][0]["message"]
    assert "7000 x 7000" in got[3][0]["message"]
    assert "12.0 MB" in got[4][0]["message"] and "GIF" in got[5][0]["message"] and "SVG" in got[6][0]["message"]
    assert "CMYK" in got[8][0]["message"] and "character 41" in got[9][0]["message"]
    assert "100 images" in got[11][0]["message"] and "fetching" in got[12][0]["message"]
    assert "image/png" in got[15][0]["message"] and "JPEG" in got[15][0]["message"]
    images = r["images"]
    assert images["images_refused"] == len(bad) - 0 and images["images_read"] == 12
    assert r["rows_kept"] == 12


def test_examples_with_images_per_file_are_capped(tmp_path, kit):
    r = report_of(kit, tmp_path, good_image_rows(5) + kit.good_rows(10),
                  settings=IngestSettings(max_image_examples=3))
    got = by_line(r)
    assert not r["accepted"] and [e["code"] for e in got[4]] == ["too_many_image_examples"] and 5 in got
    assert 3 not in got and r["images"]["rows_read"] == 3


def test_duplicates_cover_images(tmp_path, kit):
    base = picture(7, size=(64, 64))
    other = picture(8, size=(64, 64))
    q = "Describe the picture in a few words please."
    a = "A square and a circle on a coloured background."
    rows = [
        image_row(data_url(encode(base)), q, a),                                     # 1 kept
        image_row(data_url(encode(base)), q, a),                                     # 2 exact duplicate
        image_row(data_url(encode(other)), q, a),                                    # 3 same text, other image: kept
        image_row(data_url(encode(base, "JPEG", quality=85), "image/jpeg"), q, a),   # 4 re-encoded: near duplicate
        image_row(data_url(encode(base)), "A different question about this one?", "Another answer."),  # 5 kept
        *good_image_rows(10, start=20),
    ]
    r = report_of(kit, tmp_path, rows)
    assert r["accepted"], r["errors"]
    assert r["exact_duplicate_lines"] == [2]
    clusters = r["near_dup"]["clusters"]
    assert [(c["kept_line"], c["duplicate_lines"]) for c in clusters] == [(1, [4])], clusters
    assert r["rows_kept"] == 13 and r["images"]["images"] == 13 and r["images"]["images_read"] == 15


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory) -> Path:
    from whetstone.modelkit.tiny_vision import build_tiny_vision_model

    return build_tiny_vision_model(tmp_path_factory.mktemp("ingest-vlm") / "tiny-vlm", seed=0)


def test_image_tokens_counted_for_a_vision_base_and_a_text_base_refused(tmp_path, kit, tiny_vlm, ingest_tiny_model):
    rows = good_image_rows(12)
    vision = BaseModelTokenizer.load(str(tiny_vlm))
    r = report_of(kit, tmp_path / "vlm", rows, tokenizer=vision)
    assert r["accepted"], r["errors"]
    assert r["images"]["image_tokens"] == 12 * 16 and "16 tokens per image" in r["images"]["image_tokens_source"]
    tokenized = kit.read_jsonl(r["_result"].tokenized_paths["train"])
    image_id = vision.image_token_id
    for row in tokenized:
        ids, labels = row["input_ids"], row["labels"]
        assert ids.count(image_id) == 16
        assert all(lab == -100 for tok, lab in zip(ids, labels) if tok == image_id)
    preview = r["tokenization"]["mask_preview"][0]["rendered"]
    assert "<image>" in preview and "[[shapes number" in preview
    text = BaseModelTokenizer.load(str(ingest_tiny_model))
    r = report_of(kit, tmp_path / "llm", rows, tokenizer=text)
    assert not r["accepted"] and r["error_counts"]["images_unsupported_by_base"] == 12
    assert "has no image processor" in r["errors"][0]["message"]


def test_image_lines_may_exceed_the_text_line_limit_but_text_lines_may_not(tmp_path, kit):
    noise = Image.frombytes("RGB", (64, 64), random.Random(9).randbytes(64 * 64 * 3))
    url = data_url(encode(noise, "PNG"))
    rows = [image_row(url, f"Picture {i}?", f"answer {i}") for i in range(12)]
    s = IngestSettings(max_line_bytes=4096)
    r = report_of(kit, tmp_path / "a", rows, settings=s)
    assert len(json.dumps(rows[0])) > 4096 and r["accepted"], r["errors"]
    r = report_of(kit, tmp_path / "b", [{"messages": [{"role": "user", "content": "x" * 5000},
                                                      {"role": "assistant", "content": "y"}]}], settings=s)
    assert by_line(r)[1][0]["code"] == "line_too_long"
