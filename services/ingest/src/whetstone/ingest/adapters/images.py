"""Reading one image of a data URL with Pillow: bytes -> ImageFacts, or the Issue that refuses it.

The order is what keeps a hostile image cheap: the base64 text's length is checked before it is
decoded, the bytes' size before Pillow sees them, the format by the bytes' signature, then Pillow
opens the image LAZILY (the header only) and the pixel count is checked before any decoding, so a
decompression bomb costs a header read. Only then is the image decoded (a JPEG at 1/8 scale in
grey: the decoder still reads the whole stream, so truncation is caught), once, for the
difference hash.

The near-duplicate hash is a 64-bit dHash (Krawetz): the image in grey, shrunk to 9 x 8, one bit
per horizontally adjacent pair (left brighter than right). It is written here with Pillow (a dozen
lines) rather than taken from `imagehash`, which would add numpy/scipy/PyWavelets code paths for
one function: dHash survives re-encoding, rescaling and small colour shifts, costs microseconds
on the 9 x 8 image, and two images whose hashes differ in at most a few of 64 bits look alike.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import warnings

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..domain.chat import row_images
from ..domain.images import (ImageFacts, ImageLimits, RowImages, bytes_issue, judge, parse_data_url, pixels_issue,
                             sniff_format, url_issue)
from ..domain.issues import Issue

_HASH_W, _HASH_H = 9, 8


def dhash(im: Image.Image) -> int:
    """64-bit difference hash of a loaded image."""
    small = im.convert("L").resize((_HASH_W, _HASH_H), Image.Resampling.BOX)
    px = np.frombuffer(small.tobytes(), dtype=np.uint8).reshape(_HASH_H, _HASH_W)
    return int.from_bytes(np.packbits(px[:, :-1] > px[:, 1:]).tobytes(), "big")   # row by row, left bit first


def decode_base64(text: str, limits: ImageLimits, at: str, line: int) -> bytes | Issue:
    if len(text) > limits.max_base64_chars + 4:
        return Issue("image_too_large", f"{at}: the image is about {len(text) * 3 / 4 / 1024 ** 2:.1f} MB; at most "
                     f"{limits.max_bytes / 1024 ** 2:g} MB per image", line, at)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        bad = next((i for i, c in enumerate(text) if not (c.isascii() and (c.isalnum() or c in "+/="))), None)
        where = f" (character {bad + 1} of the data: {text[bad]!r})" if bad is not None else f" ({exc})"
        return Issue("image_bad_base64", f"{at}: the data URL's base64 is invalid{where}", line, at)


def inspect_bytes(data: bytes, media_type: str, limits: ImageLimits, at: str, line: int) -> ImageFacts | Issue:
    """The checks of `domain.images` on one image's bytes, cheapest first."""
    too_big = bytes_issue(len(data), limits, at, line)
    if too_big is not None:
        return too_big
    fmt = sniff_format(data)
    if fmt is None:
        return Issue("image_format_unsupported", f"{at}: the bytes are not a JPEG, PNG or WEBP image (unrecognised "
                     "content)", line, at)
    facts = ImageFacts(fmt, "", 0, 0, len(data), "", 0)
    if fmt not in ("JPEG", "PNG", "WEBP"):
        return judge(facts, media_type, limits, at, line) or Issue("image_format_unsupported", fmt, line, at)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            im = Image.open(io.BytesIO(data), formats=[fmt])     # the header only
        except Image.DecompressionBombError as exc:     # Pillow's own cap (2 x 89 M pixels): header only
            found = re.search(r"\((\d+) pixels\)", str(exc))
            size = f"{int(found.group(1)):,} pixels" if found else "the image's size"
            return Issue("image_too_many_pixels", f"{at}: {size} exceeds the limit of {limits.max_pixels:,} pixels "
                         "per image (read from the header, nothing decoded)", line, at)
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            return Issue("image_undecodable", f"{at}: the bytes start like a {fmt} image but are not a valid one "
                         f"({type(exc).__name__}: {str(exc)[:120]})", line, at)
        with im:
            width, height = im.size
            issue = pixels_issue(width, height, limits, at, line)
            if issue is not None:
                return issue
            facts = ImageFacts(fmt, im.mode, width, height, len(data), "", 0)
            issue = judge(facts, media_type, limits, at, line)
            if issue is not None:
                return issue
            if getattr(im, "n_frames", 1) > 1:
                return Issue("image_format_unsupported", f"{at}: an animated {fmt} ({im.n_frames} frames); send "
                             "one still image", line, at)
            try:
                if fmt == "JPEG":
                    im.draft("L", (max(1, width // 8), max(1, height // 8)))
                im.load()
                bits = dhash(im)
            except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
                return Issue("image_undecodable", f"{at}: the {fmt} image cannot be decoded ({type(exc).__name__}: "
                             f"{str(exc)[:120]})", line, at)
    return ImageFacts(fmt, facts.mode, width, height, len(data), hashlib.sha256(data).hexdigest(), bits)


def check_images(messages: list[dict], line: int, limits: ImageLimits) -> tuple[list[Issue], RowImages]:
    """Every image of a normalised chat row checked: (the issues that refuse the row, its images)."""
    found = row_images(messages)
    if len(found) > limits.max_per_example:
        return [Issue("too_many_images", f"the example has {len(found)} images; at most {limits.max_per_example} "
                      "per example", line, "messages")], RowImages()
    issues: list[Issue] = []
    row = RowImages()
    for image in found:
        at = image.at
        url = image.url
        issue = url_issue(url, limits, at, line)
        parsed = parse_data_url(url) if issue is None else ""
        if isinstance(parsed, str):
            issues.append(issue or Issue("image_url_refused", f"{at}: {parsed}", line, at))
            continue
        data = decode_base64(parsed[1], limits, at, line)
        facts = data if isinstance(data, Issue) else inspect_bytes(data, parsed[0], limits, at, line)
        if isinstance(facts, Issue):
            issues.append(facts)
            continue
        row.facts.append(facts)
        row.details.append(image.detail)
    return issues, row
