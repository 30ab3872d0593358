"""Images in chat requests: which are refused before any byte is decoded. Pure.

The limits are ingest's (`whetstone.modelkit.image_rules`, one module for both): a vision
adapter answers images that training would have accepted, and refuses the rest with the same
code and message, naming the part (`messages[i].content[j]`). What is refused here, before the
image reader decodes anything:

- any image for a text-only model (the served base has no image processor): `model_cannot_see_images`;
- an image outside a user message (`image_role`), as in training files;
- more images than `max_per_example` in one request (`too_many_images`);
- a `detail` other than auto, low or high;
- a URL that is not a base64 data URL: `http(s)://` URLs are refused (`image_url_refused`) unless
  the operator allows fetching, which this version does not implement (they are refused either
  way, saying so).
"""

from __future__ import annotations

from collections.abc import Sequence

from whetstone.modelkit.image_rules import ImageLimits, ImageProblem, count_problem, detail_problem, url_problem

from .catalog import ServingError
from .openai import RequestImage

IMAGE_ROLE = "user"


class ImageRefused(ServingError):
    """An image part the server will not read; `code` is the shared image rule's."""

    status, code = 400, "image_refused"

    def __init__(self, message: str, *, code: str, param: str) -> None:
        super().__init__(message, param=param)
        self.code = code

    @classmethod
    def of(cls, problem: ImageProblem, at: str) -> ImageRefused:
        return cls(problem.message, code=problem.code, param=at)


def refusal(images: Sequence[RequestImage], *, model: str, sees_images: bool,
            limits: ImageLimits) -> ImageRefused | None:
    """The first reason to refuse the request's images without reading them, or None."""
    if not images:
        return None
    first = images[0]
    if not sees_images:
        return ImageRefused(f"{first.at}: the model `{model}` is text-only (its base has no image processor); send "
                            "images to a model fine-tuned from a vision-language base", code="model_cannot_see_images",
                            param=first.at)
    for image in images:
        if image.role != IMAGE_ROLE:
            return ImageRefused(f"{image.at}: images are allowed only in user messages, not in a {image.role} "
                                "message", code="image_role", param=image.at)
    too_many = count_problem(len(images), limits, "messages")
    if too_many is not None:
        return ImageRefused.of(too_many, "messages")
    for image in images:
        problem = detail_problem(image.detail, image.at) or url_problem(image.url, limits, image.at)
        if problem is not None:
            return ImageRefused.of(problem, image.at + (".image_url.detail" if problem.code == "image_detail_invalid"
                                                        else ".image_url.url"))
    return None
