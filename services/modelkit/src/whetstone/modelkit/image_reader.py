"""Reading one image of a data URL with Pillow: bytes -> ImageFacts, or the ImageProblem that refuses it.
Shared by ingest (every image of a training file) and serving (every image of a chat request).

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

from .image_rules import (MEDIA_TYPES, FetchImage, ImageFacts, ImageLimits, ImageProblem, bytes_problem, is_fetched_url, judge,
                          parse_data_url, pixels_problem, sniff_format, url_problem)

_HASH_W, _HASH_H = 9, 8


def dhash(im: Image.Image) -> int:
    """64-bit difference hash of a loaded image."""
    small = im.convert("L").resize((_HASH_W, _HASH_H), Image.Resampling.BOX)
    px = np.frombuffer(small.tobytes(), dtype=np.uint8).reshape(_HASH_H, _HASH_W)
    return int.from_bytes(np.packbits(px[:, :-1] > px[:, 1:]).tobytes(), "big")   # row by row, left bit first


def decode_base64(text: str, limits: ImageLimits, at: str) -> bytes | ImageProblem:
    if len(text) > limits.max_base64_chars + 4:
        return ImageProblem("image_too_large", f"{at}: the image is about {len(text) * 3 / 4 / 1024 ** 2:.1f} MB; at "
                            f"most {limits.max_bytes / 1024 ** 2:g} MB per image")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        bad = next((i for i, c in enumerate(text) if not (c.isascii() and (c.isalnum() or c in "+/="))), None)
        where = f" (character {bad + 1} of the data: {text[bad]!r})" if bad is not None else f" ({exc})"
        return ImageProblem("image_bad_base64", f"{at}: the data URL's base64 is invalid{where}")


def inspect_bytes(data: bytes, media_type: str, limits: ImageLimits, at: str) -> ImageFacts | ImageProblem:
    """The checks of `image_rules` on one image's bytes, cheapest first."""
    too_big = bytes_problem(len(data), limits, at)
    if too_big is not None:
        return too_big
    fmt = sniff_format(data)
    if fmt is None:
        return ImageProblem("image_format_unsupported", f"{at}: the bytes are not a JPEG, PNG or WEBP image "
                            "(unrecognised content)")
    facts = ImageFacts(fmt, "", 0, 0, len(data), "", 0)
    if fmt not in ("JPEG", "PNG", "WEBP"):
        return judge(facts, media_type, limits, at) or ImageProblem("image_format_unsupported", fmt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            im = Image.open(io.BytesIO(data), formats=[fmt])     # the header only
        except Image.DecompressionBombError as exc:     # Pillow's own cap (2 x 89 M pixels): header only
            found = re.search(r"\((\d+) pixels\)", str(exc))
            size = f"{int(found.group(1)):,} pixels" if found else "the image's size"
            return ImageProblem("image_too_many_pixels", f"{at}: {size} exceeds the limit of {limits.max_pixels:,} "
                                "pixels per image (read from the header, nothing decoded)")
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            return ImageProblem("image_undecodable", f"{at}: the bytes start like a {fmt} image but are not a valid "
                                f"one ({type(exc).__name__}: {str(exc)[:120]})")
        with im:
            width, height = im.size
            problem = pixels_problem(width, height, limits, at)
            if problem is not None:
                return problem
            facts = ImageFacts(fmt, im.mode, width, height, len(data), "", 0)
            problem = judge(facts, media_type, limits, at)
            if problem is not None:
                return problem
            if getattr(im, "n_frames", 1) > 1:
                return ImageProblem("image_format_unsupported", f"{at}: an animated {fmt} ({im.n_frames} frames); "
                                    "send one still image")
            try:
                if fmt == "JPEG":
                    im.draft("L", (max(1, width // 8), max(1, height // 8)))
                im.load()
                bits = dhash(im)
            except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
                return ImageProblem("image_undecodable", f"{at}: the {fmt} image cannot be decoded "
                                    f"({type(exc).__name__}: {str(exc)[:120]})")
    return ImageFacts(fmt, facts.mode, width, height, len(data), hashlib.sha256(data).hexdigest(), bits)


def check_image_url(url: object, limits: ImageLimits, at: str, fetch: FetchImage | None = None
                    ) -> ImageFacts | ImageProblem:
    """One image part's URL checked end to end: the URL, its data URL, its base64, its bytes."""
    read = read_image_url(url, limits, at, fetch)
    return read if isinstance(read, ImageProblem) else read[0]


def read_image_url(url: object, limits: ImageLimits, at: str, fetch: FetchImage | None = None
                   ) -> tuple[ImageFacts, str] | ImageProblem:
    """`check_image_url`, and the URL the image is read from from now on: the URL itself, or for an
    http(s) URL (where the operator allows fetching and `fetch` is given) a data URL of the fetched bytes."""
    problem = url_problem(url, limits, at)
    if problem is not None:
        return problem
    assert isinstance(url, str)     # url_problem refuses anything else
    if is_fetched_url(url):
        if fetch is None:
            return ImageProblem("image_url_refused", f"{at}: image URLs are not fetched here; embed the image as a "
                                "base64 data URL (data:image/png;base64,...)")
        got = fetch(url)
        if isinstance(got, str):
            return ImageProblem("image_fetch_refused", f"{at}: the image URL was not fetched: {got}")
        data = got[0]
        facts = inspect_bytes(data, "", limits, at)      # the format by content: a server's Content-Type is not trusted
        if isinstance(facts, ImageProblem):
            return facts
        media = next(m for m, f in MEDIA_TYPES.items() if f == facts.format)
        return facts, f"data:{media};base64,{base64.b64encode(data).decode()}"
    parsed = parse_data_url(url)
    if isinstance(parsed, str):
        return ImageProblem("image_url_refused", f"{at}: {parsed}")
    data = decode_base64(parsed[1], limits, at)
    if isinstance(data, ImageProblem):
        return data
    facts = inspect_bytes(data, parsed[0], limits, at)
    return facts if isinstance(facts, ImageProblem) else (facts, url)
