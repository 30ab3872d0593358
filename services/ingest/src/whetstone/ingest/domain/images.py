"""Image parts of chat rows: the rules, as pure decisions over what the image reader read. Pure.

The limits on one image part live in `whetstone.modelkit.image_rules` (serving checks chat
requests with the same code); this module reports their refusals as ingest's line-numbered
issues and keeps what only a training file has (rows, duplicates, token estimates).

A user message's content may hold OpenAI's image parts:

    {"type": "image_url", "image_url": {"url": "data:image/png;base64,...", "detail": "auto|low|high"}}

What is accepted (OpenAI's vision fine-tuning rules, with the platform's choices where OpenAI
says nothing):

- where: user messages only (OpenAI's system content is text only; assistant output cannot be an
  image; tool results are text), and only in the OpenAI chat layout (`messages`);
- url: a `data:<media type>;base64,<data>` URL. `http(s)://` URLs are refused unless the operator
  allows fetching (`IngestSettings.image_fetch`); then each is fetched once, at validation
  (`whetstone.runtime.url_fetch`: public addresses only unless `image_fetch_allow_hosts` names the
  host, the resolved address pinned, bytes and time capped), checked as a data URL's bytes are, and
  the row is rewritten to a data URL of the fetched bytes: the dataset version (content-addressed
  in S3) holds the image itself, so training never fetches;
- format by content (the bytes' signature, then Pillow's parser), never by name: JPEG, PNG, WEBP.
  GIF, SVG, BMP, TIFF, ICO, AVIF, HEIC and anything unrecognised are refused, and so is an
  animated PNG or WEBP (more than one frame). A data URL whose media type names another format
  than the bytes hold (`data:image/png` on JPEG bytes) is refused: fix the media type;
- mode: RGB and RGBA are accepted as they are. L, LA, P and PA (grey and palette images, common in
  PNG) and 1 (bilevel) are accepted and converted at training time (to RGB, or RGBA when the image
  has transparency); the report counts them (`images.converted`) with one warning.
  CMYK, YCbCr, LAB, HSV, I, F and the 16-bit modes are refused (colours would change silently):
  convert them to RGB before uploading;
- bytes: at most `max_bytes` per image (10 MB), decoded size, checked before Pillow sees them;
- pixels: at most `max_pixels` per image, read from the header BEFORE any decoding
  (a 30,000 x 30,000 PNG of a few kilobytes is a decompression bomb);
- decodable: the whole image is decoded once (a truncated file or a corrupt stream is refused);
- at most `max_per_example` images per example (10) and `max_examples` examples with images per
  file (50,000);
- `detail`: auto, low or high (default auto).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from whetstone.modelkit import image_rules as rules
from whetstone.modelkit.image_rules import (ACCEPTED_MODES, CONVERTED_MODES, DETAILS, FORMATS, MEDIA_TYPES,
                                            ImageFacts, ImageLimits, ImageProblem, parse_data_url, sniff_format)

from .issues import Issue

__all__ = ["ACCEPTED_MODES", "CONVERTED_MODES", "DETAILS", "FORMATS", "MEDIA_TYPES", "IMAGE_ROLE", "ImageFacts",
           "ImageLimits", "ImagePart", "ImageProblem", "RowImages", "as_issue", "bytes_issue", "hamming", "image_similarity", "judge",
           "openai_image_tokens", "parse_data_url", "pixels_issue", "sniff_format", "url_issue"]

IMAGE_ROLE = "user"


@dataclass(frozen=True)
class ImagePart:
    """One image part of a normalised chat row (`messages[message].content[part]`): its URL and detail."""

    message: int
    part: int
    url: str
    detail: str = "auto"

    @property
    def at(self) -> str:
        """Where the part is, as issues name it."""
        return f"messages[{self.message}].content[{self.part}]"


@dataclass
class RowImages:
    """The images of one accepted row: counted by the gate, in file order."""

    facts: list[ImageFacts] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    fetched: int = 0           # images fetched from http(s) URLs (their parts now hold data URLs)

    @property
    def count(self) -> int:
        return len(self.facts)

    def converted(self) -> int:
        return sum(f.mode in CONVERTED_MODES for f in self.facts)


def as_issue(problem: ImageProblem | None, line: int, at: str) -> Issue | None:
    """A shared image rule's refusal as ingest reports it: on its line, naming the part."""
    return None if problem is None else Issue(problem.code, problem.message, line, at)


def url_issue(url: object, limits: ImageLimits, at: str, line: int) -> Issue | None:
    """The URL's own problems (not its content)."""
    return as_issue(rules.url_problem(url, limits, at), line, at)


def judge(facts: ImageFacts, media_type: str, limits: ImageLimits, at: str, line: int) -> Issue | None:
    """The rules on what the image reader read (format, declared media type, pixels, mode)."""
    return as_issue(rules.judge(facts, media_type, limits, at), line, at)


def pixels_issue(width: int, height: int, limits: ImageLimits, at: str, line: int) -> Issue | None:
    return as_issue(rules.pixels_problem(width, height, limits, at), line, at)


def bytes_issue(nbytes: int, limits: ImageLimits, at: str, line: int) -> Issue | None:
    return as_issue(rules.bytes_problem(nbytes, limits, at), line, at)


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()


def image_similarity(a: list[int], b: list[int]) -> float:
    """1 - (the largest Hamming distance of the two rows' image hashes, in order) / 64; 0 when the rows
    have a different number of images. 1.0 for two rows without images."""
    if len(a) != len(b):
        return 0.0
    if not a:
        return 1.0
    return 1.0 - max(hamming(x, y) for x, y in zip(a, b)) / 64


def openai_image_tokens(width: int, height: int, detail: str) -> int:
    """An estimate of an image's tokens when no base model is given: the tile formula OpenAI documents
    for GPT-4o (low: 85; else scaled to fit 2048 x 2048, then the short side to 768, 170 per 512-px
    tile plus 85)."""
    if detail == "low":
        return 85
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        s = 2048 / max(w, h)
        w, h = w * s, h * s
    if min(w, h) > 768:
        s = 768 / min(w, h)
        w, h = w * s, h * s
    tiles = -(-int(w) // 512) * -(-int(h) // 512)
    return 85 + 170 * tiles
