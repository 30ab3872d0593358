"""Checking the images of one chat row: each image part through the shared reader
(`whetstone.modelkit.image_reader`: base64 length, bytes, signature, header pixels, then one decode
for the dHash), its refusal reported on the row's line. Where the operator allows fetching, an
http(s) image URL is fetched here (`whetstone.runtime.url_fetch`) and its part rewritten IN PLACE
to a data URL of the fetched bytes (`RowImages.fetched` counts them: the row must be re-encoded)."""

from __future__ import annotations

from functools import lru_cache

from whetstone.modelkit.image_reader import read_image_url
from whetstone.modelkit.image_rules import FetchImage
from whetstone.runtime.addresses import AllowList
from whetstone.runtime.url_fetch import FetchPolicy, fetch_port

from ..domain.chat import row_images
from ..domain.images import ImageLimits, ImageProblem, RowImages
from ..domain.issues import Issue


@lru_cache(maxsize=4)
def image_fetcher(limits: ImageLimits) -> FetchImage | None:
    """The fetcher the operator's setting allows (None: fetching is off)."""
    if not limits.allow_fetch:
        return None
    return fetch_port(FetchPolicy(AllowList.parse(limits.fetch_allow_hosts), limits.max_bytes, limits.fetch_timeout_s))


def check_images(messages: list[dict], line: int, limits: ImageLimits) -> tuple[list[Issue], RowImages]:
    """Every image of a normalised chat row checked: (the issues that refuse the row, its images)."""
    found = row_images(messages)
    if len(found) > limits.max_per_example:
        return [Issue("too_many_images", f"the example has {len(found)} images; at most {limits.max_per_example} "
                      "per example", line, "messages")], RowImages()
    issues: list[Issue] = []
    row = RowImages()
    fetcher = image_fetcher(limits)
    for image in found:
        read = read_image_url(image.url, limits, image.at, fetcher)
        if isinstance(read, ImageProblem):
            issues.append(Issue(read.code, read.message, line, image.at))
            continue
        facts, url = read
        if url is not image.url:
            messages[image.message]["content"][image.part]["image_url"]["url"] = url
            row.fetched += 1
        row.facts.append(facts)
        row.details.append(image.detail)
    return issues, row
