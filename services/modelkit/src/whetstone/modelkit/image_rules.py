"""The limits on one image part, shared by ingest (training files) and serving (chat requests). Pure.

An image part is OpenAI's `{"type": "image_url", "image_url": {"url": "data:image/png;base64,...",
"detail": "auto|low|high"}}`. What is accepted (OpenAI's vision rules, with the platform's choices
where OpenAI says nothing):

- url: a `data:<media type>;base64,<data>` URL. `http(s)://` URLs are refused unless the operator
  allows fetching (`ImageLimits.allow_fetch`); then the caller's fetcher (`whetstone.runtime.url_fetch`:
  public addresses only, or hosts in `fetch_allow_hosts`; the resolved address pinned; bytes and
  time capped) fetches them and the fetched bytes are checked as a data URL's are;
- format by content (the bytes' signature, then Pillow's parser), never by name: JPEG, PNG, WEBP.
  GIF, SVG, BMP, TIFF, ICO, AVIF, HEIC and anything unrecognised are refused, and so is an
  animated PNG or WEBP (more than one frame). A data URL whose media type names another format
  than the bytes hold (`data:image/png` on JPEG bytes) is refused: fix the media type;
- mode: RGB and RGBA as they are; L, LA, P, PA and 1 (grey, palette, bilevel) accepted and
  converted when the image is opened for the model; CMYK, YCbCr, LAB, HSV, I, F and the 16-bit
  modes refused (colours would change silently);
- bytes: at most `max_bytes` per image (10 MB), decoded size, checked before Pillow sees them;
- pixels: at most `max_pixels` per image, read from the header BEFORE any decoding;
- at most `max_per_example` images per example (10);
- `detail`: auto, low or high (default auto).

Each refusal is an `ImageProblem` (a code and a message naming the part, e.g.
`messages[0].content[1]`); ingest adds the file's line, serving answers it as an OpenAI 400.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# fetches an http(s) image URL: (bytes, the media type the server named), or the reason it was not fetched
FetchImage = Callable[[str], "tuple[bytes, str] | str"]

FORMATS = ("JPEG", "PNG", "WEBP")
MEDIA_TYPES = {"image/jpeg": "JPEG", "image/jpg": "JPEG", "image/pjpeg": "JPEG", "image/png": "PNG",
               "image/webp": "WEBP"}
DETAILS = ("auto", "low", "high")
ACCEPTED_MODES = ("RGB", "RGBA")
CONVERTED_MODES = ("L", "LA", "P", "PA", "1")


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 10 * 1024 ** 2
    max_pixels: int = 36_000_000                 # e.g. 6000 x 6000; checked from the header
    max_per_example: int = 10
    max_examples: int = 50_000
    allow_fetch: bool = False                    # http(s):// URLs: refused unless the operator allows fetching
    fetch_allow_hosts: tuple[str, ...] = ()      # non-public hosts that may be fetched (AllowList entries; tests)
    fetch_timeout_s: float = 10.0

    @property
    def max_base64_chars(self) -> int:
        """The longest base64 text an accepted image can have."""
        return 4 * ((self.max_bytes + 2) // 3)


@dataclass(frozen=True)
class ImageFacts:
    """What the image reader read of one image."""

    format: str
    mode: str
    width: int
    height: int
    nbytes: int
    sha256: str                 # of the image bytes
    dhash: int                  # 64-bit difference hash of the decoded image (near duplicates)


@dataclass(frozen=True)
class ImageProblem:
    """Why one image part is refused: a stable code and a message that names the part."""

    code: str
    message: str


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


def is_fetched_url(url: object) -> bool:
    return isinstance(url, str) and url[:8].lower().startswith(("https://", "http://"))


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


def url_problem(url: object, limits: ImageLimits, at: str) -> ImageProblem | None:
    """The URL's own problems (not its content)."""
    if not isinstance(url, str) or not url.strip():
        return ImageProblem("image_part_invalid", f"{at}.image_url.url must be a non-empty string")
    low = url[:16].lower()
    if low.startswith("data:"):
        return None
    if low.startswith(("https://", "http://")):
        if limits.allow_fetch:
            return None                     # the caller fetches it (FetchImage)
        return ImageProblem("image_url_refused", f"{at}: fetching image URLs is not enabled on this platform; "
                            "embed the image as a base64 data URL (data:image/png;base64,...)")
    return ImageProblem("image_url_refused", f"{at}: the image URL must be a base64 data URL "
                        f"(data:image/jpeg;base64,...), not {url[:24]!r}")


def judge(facts: ImageFacts, media_type: str, limits: ImageLimits, at: str) -> ImageProblem | None:
    """The rules on what the reader read (format, declared media type, pixels, mode)."""
    if facts.format not in FORMATS:
        return ImageProblem("image_format_unsupported", f"{at}: {facts.format} images are not supported; use JPEG, "
                            "PNG or WEBP")
    declared = MEDIA_TYPES.get(media_type)
    if declared is not None and declared != facts.format:
        return ImageProblem("image_media_type_mismatch", f"{at}: the data URL says {media_type} but the bytes are a "
                            f"{facts.format} image; fix the media type")
    if declared is None and media_type not in ("", "image/*"):
        return ImageProblem("image_media_type_mismatch", f"{at}: the data URL's media type {media_type[:40]!r} is "
                            "not image/jpeg, image/png or image/webp")
    pixel_problem = pixels_problem(facts.width, facts.height, limits, at)
    if pixel_problem is not None:
        return pixel_problem
    if facts.mode not in ACCEPTED_MODES and facts.mode not in CONVERTED_MODES:
        return ImageProblem("image_mode_unsupported", f"{at}: image mode {facts.mode} is not supported (RGB or RGBA; "
                            "grey and palette images are converted); convert the image to RGB")
    return None


def pixels_problem(width: int, height: int, limits: ImageLimits, at: str) -> ImageProblem | None:
    if width * height > limits.max_pixels:
        return ImageProblem("image_too_many_pixels", f"{at}: {width} x {height} pixels ({width * height:,}) exceeds "
                            f"the limit of {limits.max_pixels:,} pixels per image")
    if width < 1 or height < 1:
        return ImageProblem("image_undecodable", f"{at}: the image has no pixels ({width} x {height})")
    return None


def bytes_problem(nbytes: int, limits: ImageLimits, at: str) -> ImageProblem | None:
    if nbytes > limits.max_bytes:
        return ImageProblem("image_too_large", f"{at}: the image is {nbytes / 1024 ** 2:.1f} MB; at most "
                            f"{limits.max_bytes / 1024 ** 2:g} MB per image")
    return None


def count_problem(count: int, limits: ImageLimits, at: str) -> ImageProblem | None:
    """Too many images in one example (a training row, or one chat request)."""
    if count > limits.max_per_example:
        return ImageProblem("too_many_images", f"{at}: {count} images; at most {limits.max_per_example} per example")
    return None


def detail_problem(detail: object, at: str) -> ImageProblem | None:
    if detail not in DETAILS:
        return ImageProblem("image_detail_invalid", f"{at}.image_url.detail {str(detail)[:20]!r} must be one of "
                            f"{', '.join(DETAILS)}")
    return None
