"""Checking the images of one chat row: each image part through the shared reader
(`whetstone.modelkit.image_reader`: base64 length, bytes, signature, header pixels, then one decode
for the dHash), its refusal reported on the row's line."""

from __future__ import annotations

from whetstone.modelkit.image_reader import check_image_url

from ..domain.chat import row_images
from ..domain.images import ImageLimits, ImageProblem, RowImages
from ..domain.issues import Issue

def check_images(messages: list[dict], line: int, limits: ImageLimits) -> tuple[list[Issue], RowImages]:
    """Every image of a normalised chat row checked: (the issues that refuse the row, its images)."""
    found = row_images(messages)
    if len(found) > limits.max_per_example:
        return [Issue("too_many_images", f"the example has {len(found)} images; at most {limits.max_per_example} "
                      "per example", line, "messages")], RowImages()
    issues: list[Issue] = []
    row = RowImages()
    for image in found:
        facts = check_image_url(image.url, limits, image.at)
        if isinstance(facts, ImageProblem):
            issues.append(Issue(facts.code, facts.message, line, image.at))
            continue
        row.facts.append(facts)
        row.details.append(image.detail)
    return issues, row
