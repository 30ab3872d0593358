"""Image parts of chat rows: the rules, as pure decisions over what the image adapter read. Pure.

A user message's content may hold OpenAI's image parts:

    {"type": "image_url", "image_url": {"url": "data:image/png;base64,...", "detail": "auto|low|high"}}

What is accepted (OpenAI's vision fine-tuning rules, with the platform's choices where OpenAI
says nothing):

- where: user messages only (OpenAI's system content is text only; assistant output cannot be an
  image; tool results are text), and only in the OpenAI chat layout (`messages`);
- url: a `data:<media type>;base64,<data>` URL. `https://` URLs are refused unless the operator
  allows fetching (`IngestSettings.image_fetch`), which this version does not implement: they are
  refused with a message saying so (training must never fetch);
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

from .issues import Issue

FORMATS = ("JPEG", "PNG", "WEBP")
MEDIA_TYPES = {"image/jpeg": "JPEG", "image/jpg": "JPEG", "image/pjpeg": "JPEG", "image/png": "PNG",
               "image/webp": "WEBP"}
DETAILS = ("auto", "low", "high")
ACCEPTED_MODES = ("RGB", "RGBA")
CONVERTED_MODES = ("L", "LA", "P", "PA", "1")
IMAGE_ROLE = "user"


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 10 * 1024 ** 2
    max_pixels: int = 36_000_000                 # e.g. 6000 x 6000; checked from the header
    max_per_example: int = 10
    max_examples: int = 50_000
    allow_fetch: bool = False                    # https:// URLs: refused unless the operator allows (not built)

    @property
    def max_base64_chars(self) -> int:
        """The longest base64 text an accepted image can have."""
        return 4 * ((self.max_bytes + 2) // 3)


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


@dataclass(frozen=True)
class ImageFacts:
    """What the image adapter read of one image."""

    format: str
    mode: str
    width: int
    height: int
    nbytes: int
    sha256: str                 # of the image bytes
    dhash: int                  # 64-bit difference hash of the decoded image (near duplicates)


@dataclass
class RowImages:
    """The images of one accepted row: counted by the gate, in file order."""

    facts: list[ImageFacts] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.facts)

    def converted(self) -> int:
        return sum(f.mode in CONVERTED_MODES for f in self.facts)


def sniff_format(data: bytes) -> str | None:
    """The format the bytes' signature names (also the refused ones, to say what was sent)."""
    head = data[:32]
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if head[:2] == b"BM":
        return "BMP"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    if head[:4] == b"\x00\x00\x01\x00":
        return "ICO"
    if head[4:8] == b"ftyp":
        return "AVIF/HEIC"
    text = data[:512].lstrip().lower()
    if text.startswith((b"<?xml", b"<svg", b"<!doctype svg")) or b"<svg" in text:
        return "SVG"
    return None


def parse_data_url(url: str) -> tuple[str, str] | str:
    """`data:<media type>[;params];base64,<data>` -> (media type, base64 text), or why not."""
    head, comma, body = url.partition(",")
    if not comma:
        return "a data URL needs a comma before the data (data:image/png;base64,...)"
    params = head[5:].split(";")
    media = params[0].strip().lower()
    if "base64" not in (p.strip().lower() for p in params[1:]):
        return "a data URL must be base64-encoded (data:image/png;base64,...)"
    return media, body


def url_issue(url: object, limits: ImageLimits, at: str, line: int) -> Issue | None:
    """The URL's own problems (not its content)."""
    if not isinstance(url, str) or not url.strip():
        return Issue("image_part_invalid", f"{at}.image_url.url must be a non-empty string", line, at)
    low = url[:16].lower()
    if low.startswith("data:"):
        return None
    if low.startswith(("https://", "http://")):
        why = ("fetching image URLs is not enabled on this platform" if not limits.allow_fetch
               else "image URLs are not fetched by this version")
        return Issue("image_url_refused", f"{at}: {why}; embed the image as a base64 data URL "
                     "(data:image/png;base64,...)", line, at)
    return Issue("image_url_refused", f"{at}: the image URL must be a base64 data URL "
                 f"(data:image/jpeg;base64,...), not {url[:24]!r}", line, at)


def judge(facts: ImageFacts, media_type: str, limits: ImageLimits, at: str, line: int) -> Issue | None:
    """The rules on what the adapter read (format, declared media type, mode, pixels)."""
    if facts.format not in FORMATS:
        return Issue("image_format_unsupported", f"{at}: {facts.format} images are not supported; use JPEG, PNG "
                     "or WEBP", line, at)
    declared = MEDIA_TYPES.get(media_type)
    if declared is not None and declared != facts.format:
        return Issue("image_media_type_mismatch", f"{at}: the data URL says {media_type} but the bytes are a "
                     f"{facts.format} image; fix the media type", line, at)
    if declared is None and media_type not in ("", "image/*"):
        return Issue("image_media_type_mismatch", f"{at}: the data URL's media type {media_type[:40]!r} is not "
                     "image/jpeg, image/png or image/webp", line, at)
    pixel_issue = pixels_issue(facts.width, facts.height, limits, at, line)
    if pixel_issue is not None:
        return pixel_issue
    if facts.mode not in ACCEPTED_MODES and facts.mode not in CONVERTED_MODES:
        return Issue("image_mode_unsupported", f"{at}: image mode {facts.mode} is not supported (RGB or RGBA; "
                     "grey and palette images are converted); convert the image to RGB", line, at)
    return None


def pixels_issue(width: int, height: int, limits: ImageLimits, at: str, line: int) -> Issue | None:
    if width * height > limits.max_pixels:
        return Issue("image_too_many_pixels", f"{at}: {width} x {height} pixels ({width * height:,}) exceeds "
                     f"the limit of {limits.max_pixels:,} pixels per image", line, at)
    if width < 1 or height < 1:
        return Issue("image_undecodable", f"{at}: the image has no pixels ({width} x {height})", line, at)
    return None


def bytes_issue(nbytes: int, limits: ImageLimits, at: str, line: int) -> Issue | None:
    if nbytes > limits.max_bytes:
        return Issue("image_too_large", f"{at}: the image is {nbytes / 1024 ** 2:.1f} MB; at most "
                     f"{limits.max_bytes / 1024 ** 2:g} MB per image", line, at)
    return None


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
