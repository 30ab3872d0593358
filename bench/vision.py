"""Vision benchmark, ingest half: the full data gate on 10,000 generated images with a
share of planted bad ones.

1. generate N image examples (default 10,000) of a visual task a tiny VLM can learn and text alone
   cannot solve: "What colour is the shape?" over a 64 x 64 picture of a circle, square or triangle
   in one of 6 colours, at a random place and size on a noisy background (PNG, JPEG and WEBP; a few
   grey and palette PNGs). About 3 % of the examples carry one planted bad image, cycling through
   the issue's bad input: a PNG header on JPEG bytes, a 30,000 x 30,000 PNG header (decompression
   bomb), a 12 MB image (only 2, they are large), a GIF, an SVG, a BMP, a CMYK JPEG, base64 with
   garbage in the middle, an image in an assistant message, 100 images in one example, https URLs
   at 127.0.0.1 and at the metadata address, a truncated PNG, a data URL that says image/png over
   JPEG bytes, an invalid `detail`;
2. run the gate (`DataGate`, what the service and `whet datasets check` run) on the JSONL file with
   `--workers` processes (default WHETSTONE_INGEST_WORKERS, else 1 as the service) and every error
   listed, then score: each planted line must be refused (with its line), no good line refused.

    .venv/bin/python bench/vision.py [--examples N] [--bad-share 0.03] [--seed S] [--keep DIR]

Targets: ingest_images_per_s >= 500, bad_images_refused == bad_images_planted,
good_images_refused == 0, peak_rss_mb <= 1024 (the gate's process and its largest worker).
3. the training half (bench/vision_train.py, skipped with --no-train): the tiny LLaVA is trained on
   generated pictures of the same task through the real platform on the embedded stack (the official
   openai client uploads a training and a held-out file and creates a supervised job on `tiny-llava`;
   LoRA on the language model, vision tower and projector frozen), and the job's eval gate scores base and
   candidate greedily on the held-out pictures: accuracy_base, accuracy_candidate are its holdout label
   accuracy (target >= 0.9, the base near chance).
Last line: JSON.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
import resource
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

from PIL import Image, ImageDraw

from whetstone.ingest.adapters.formats import open_source
from whetstone.ingest.config import IngestSettings
from whetstone.ingest.usecases.gates import GateRequest, archive_limits, make_gate

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (40, 60, 220), "yellow": (240, 220, 40),
           "purple": (140, 50, 170), "orange": (245, 140, 20)}
SHAPES = ("circle", "square", "triangle")
QUESTION = "What colour is the shape in the picture? Answer with one word."
BAD_KINDS = ("png_header_on_jpeg", "bomb_30k", "gif", "svg", "bmp", "cmyk", "garbage_base64", "assistant_image",
             "hundred_images", "https_loopback", "https_metadata", "truncated", "media_type_mismatch",
             "bad_detail", "too_large_12mb")


def picture(rng: random.Random, size: int = 64) -> tuple[Image.Image, str, str]:
    colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
    noise = bytes(rng.randrange(200, 256) for _ in range(size * size // 16))
    im = Image.frombytes("L", (size // 4, size // 4), noise).resize((size, size)).convert("RGB")
    d = ImageDraw.Draw(im)
    r = rng.randrange(10, 22)
    x, y = rng.randrange(r, size - r), rng.randrange(r, size - r)
    fill = COLOURS[colour]
    if shape == "circle":
        d.ellipse([x - r, y - r, x + r, y + r], fill=fill)
    elif shape == "square":
        d.rectangle([x - r, y - r, x + r, y + r], fill=fill)
    else:
        d.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=fill)
    return im, colour, shape


def encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def data_url(data: bytes, media: str) -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def row(url: str, answer: str, detail: str | None = None) -> dict:
    image = {"url": url, **({"detail": detail} if detail else {})}
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                                      {"type": "image_url", "image_url": image}]},
                         {"role": "assistant", "content": answer}]}


def bomb_header(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def good_row(rng: random.Random, i: int) -> tuple[dict, int]:
    im, colour, _ = picture(rng)
    k = i % 20
    if k < 11:
        url = data_url(encode(im, "PNG"), "image/png")
    elif k < 17:
        url = data_url(encode(im, "JPEG", quality=85), "image/jpeg")
    elif k < 19:
        url = data_url(encode(im, "WEBP", quality=80), "image/webp")
    else:
        url = data_url(encode(im.convert("P", palette=Image.Palette.ADAPTIVE, colors=16), "PNG"), "image/png")
    return row(url, colour, detail=("low", "high", None)[i % 3]), 1


def bad_row(rng: random.Random, kind: str) -> tuple[dict, int]:
    """A row with one planted bad image (the count of images it holds)."""
    im, colour, _ = picture(rng)
    png, jpeg = encode(im, "PNG"), encode(im, "JPEG")
    if kind == "png_header_on_jpeg":
        return row(data_url(b"\x89PNG\r\n\x1a\n" + jpeg, "image/png"), colour), 1
    if kind == "bomb_30k":
        return row(data_url(bomb_header(30_000, 30_000), "image/png"), colour), 1
    if kind == "gif":
        return row(data_url(encode(im, "GIF"), "image/gif"), colour), 1
    if kind == "svg":
        return row(data_url(b'<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"/>', "image/svg+xml"),
                   colour), 1
    if kind == "bmp":
        return row(data_url(encode(im, "BMP"), "image/bmp"), colour), 1
    if kind == "cmyk":
        return row(data_url(encode(im.convert("CMYK"), "JPEG"), "image/jpeg"), colour), 1
    if kind == "garbage_base64":
        b64 = base64.b64encode(png).decode()
        return row("data:image/png;base64," + b64[:100] + "#garbage#" + b64[100:], colour), 1
    if kind == "assistant_image":
        return {"messages": [{"role": "user", "content": QUESTION},
                             {"role": "assistant", "content": [{"type": "image_url", "image_url": {
                                 "url": data_url(png, "image/png")}}]}]}, 1
    if kind == "hundred_images":
        part = {"type": "image_url", "image_url": {"url": data_url(encode(im.resize((8, 8)), "PNG"), "image/png")}}
        return {"messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}] + [part] * 100},
                             {"role": "assistant", "content": colour}]}, 100
    if kind == "https_loopback":
        return row("https://127.0.0.1:8080/shape.png", colour), 1
    if kind == "https_metadata":
        return row("http://169.254.169.254/latest/meta-data/iam/", colour), 1
    if kind == "truncated":
        return row(data_url(png[: len(png) * 2 // 3], "image/png"), colour), 1
    if kind == "media_type_mismatch":
        return row(data_url(jpeg, "image/png"), colour), 1
    if kind == "bad_detail":
        return row(data_url(png, "image/png"), colour, detail="ultra"), 1
    if kind == "too_large_12mb":
        return row(data_url(b"\x89PNG\r\n\x1a\n" + rng.randbytes(12 * 1024 ** 2), "image/png"), colour), 1
    raise ValueError(kind)


def generate(path: Path, n: int, bad_share: float, seed: int) -> tuple[set[int], int, dict[str, int]]:
    """Write the JSONL file; (planted lines, images in the file, planted kinds)."""
    rng = random.Random(seed)
    every = max(1, round(1 / bad_share)) if bad_share > 0 else 0
    planted: set[int] = set()
    kinds: dict[str, int] = {}
    images = 0
    large = 0
    with open(path, "wb") as f:
        for i in range(n):
            line = i + 1
            if every and i % every == every // 2:
                kind = BAD_KINDS[len(planted) % len(BAD_KINDS)]
                if kind == "too_large_12mb":
                    large += 1
                    if large > 2:        # two are enough (each line is 16 MB)
                        kind = "gif"
                r, count = bad_row(rng, kind)
                planted.add(line)
                kinds[kind] = kinds.get(kind, 0) + 1
            else:
                r, count = good_row(rng, i)
            images += count
            f.write(json.dumps(r).encode() + b"\n")
    return planted, images, kinds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=10_000)
    ap.add_argument("--bad-share", type=float, default=0.03)
    ap.add_argument("--seed", type=int, default=37)
    ap.add_argument("--workers", type=int, default=int(os.environ.get("WHETSTONE_INGEST_WORKERS", "1")))
    ap.add_argument("--keep", type=Path, help="keep the generated file and the gate's outputs here")
    ap.add_argument("--no-train", action="store_true", help="the ingest half only (accuracy_* stay null)")
    ap.add_argument("--train-examples", type=int, default=600, help="training half: examples trained on")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-vision-")) if args.keep is None else args.keep
    work.mkdir(parents=True, exist_ok=True)
    path = work / "vision.jsonl"
    t = time.perf_counter()
    planted, images, kinds = generate(path, args.examples, args.bad_share, args.seed)
    gen_s = time.perf_counter() - t
    print(f"generated {args.examples} examples ({images} images, {len(planted)} planted bad) "
          f"{path.stat().st_size / 1e6:.0f} MB in {gen_s:.1f}s", file=sys.stderr)

    settings = IngestSettings(workers=args.workers, max_examples=10 * args.examples)
    gate = make_gate(settings, GateRequest(purpose="sft"), tokenizer=None, references=None, toxicity=None)
    gate.config.max_listed = 10 * args.examples       # every error listed with its line
    load_before = os.getloadavg()[0]
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    source = open_source(path, workdir=work / "source", max_line_bytes=settings.max_line_bytes,
                         image_line_bytes=settings.max_record_bytes, limits=archive_limits(settings))
    result = gate.run(source, work / "gate")
    wall = time.perf_counter() - t
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    report = result.report.as_dict()
    refused_lines = {e["line"] for e in report["errors"] if e["line"] is not None}
    assert len(report["errors"]) == report["error_count"], "every error must be listed"
    bad_refused = len(planted & refused_lines)
    good_refused = len(refused_lines - planted)
    cpu_s = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime) + \
        report["timings"].get("workers_cpu_s", 0.0)
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               report["timings"].get("workers_peak_rss_mb", 0.0))
    images_report = report["images"] or {}
    out = {
        "examples": args.examples, "images": images, "workers": args.workers,
        "ingest_images_per_s": round(images / wall, 1), "ingest_examples_per_s": round(args.examples / wall, 1),
        "images_per_cpu_s": round(images / max(cpu_s, 1e-9), 1), "gate_wall_s": round(wall, 2),
        "bad_images_planted": len(planted), "bad_images_refused": bad_refused, "good_images_refused": good_refused,
        "planted_kinds": kinds, "error_counts": report["error_counts"],
        "images_read": images_report.get("images_read"), "images_written": images_report.get("images"),
        "near_duplicates": report["near_duplicates"], "exact_duplicates": report["exact_duplicates"],
        "peak_rss_mb": round(peak, 1), "load_1m_before": round(load_before, 2),
        "load_1m_after": round(os.getloadavg()[0], 2), "timings": report["timings"],
        "accuracy_base": None, "accuracy_candidate": None,
        "targets_met": {"ingest_images_per_s": images / wall >= 500, "bad_refused": bad_refused == len(planted),
                        "good_refused": good_refused == 0, "peak_rss_mb": peak <= 1024},
    }
    if not args.no_train:
        from vision_train import train_and_score  # noqa: PLC0415 - torch only when training

        try:
            trained = train_and_score(work / "train", train=args.train_examples, heldout=120, epochs=3,
                                      seed=args.seed)
        except SystemExit as exc:        # the platform run failed: the ingest half's figures still print
            trained = {"error": str(exc), "accuracy_base": None, "accuracy_candidate": None}
        out["training"] = trained
        out["accuracy_base"], out["accuracy_candidate"] = trained["accuracy_base"], trained["accuracy_candidate"]
        out["targets_met"]["accuracy_candidate"] = (trained["accuracy_candidate"] or 0.0) >= 0.9
    if args.keep is None:
        import shutil  # noqa: PLC0415

        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out))
    return 0 if bad_refused == len(planted) and good_refused == 0 and out["targets_met"].get(
        "accuracy_candidate", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
