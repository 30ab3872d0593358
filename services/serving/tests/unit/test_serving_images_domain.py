"""Which chat images serving refuses before reading them (the shared image rules, as OpenAI 400s)."""

import pytest

from whetstone.modelkit.image_rules import ImageLimits
from whetstone.serving.domain.images import refusal
from whetstone.serving.domain.openai import ChatCompletionRequest

pytestmark = pytest.mark.unit
PNG = "data:image/png;base64,iVBORw0KGgo="


def request(*contents, role="user"):
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": role, "content": [{"type": "text", "text": "look"}, *contents]}]})


def image(url=PNG, **extra):
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def refused(req, sees=True, limits=ImageLimits()):
    found = refusal(req.images(), model="ft:m", sees_images=sees, limits=limits)
    return None if found is None else (found.status, found.code, found.param)


def test_images_are_read_from_the_request_in_order_with_their_place():
    req = request(image(), image(detail="low"))
    assert [(i.at, i.detail) for i in req.images()] == [("messages[0].content[1]", "auto"),
                                                        ("messages[0].content[2]", "low")]
    assert req.messages[0].as_template_message("<image>") == {"role": "user", "content": "look<image><image>"}
    assert refused(req) is None
    assert refused(request()) is None and refused(request(), sees=False) is None   # no images: nothing to refuse


def test_refusals_name_the_part():
    assert refused(request(image()), sees=False) == (400, "model_cannot_see_images", "messages[0].content[1]")
    assert refused(request(image(), role="assistant")) == (400, "image_role", "messages[0].content[1]")
    assert refused(request(image(), image()), limits=ImageLimits(max_per_example=1)) == (400, "too_many_images",
                                                                                          "messages")
    assert refused(request(image(detail="max"))) == (400, "image_detail_invalid",
                                                     "messages[0].content[1].image_url.detail")
    for url in ("https://example.com/a.png", "http://127.0.0.1/a.png", "ftp://x/a.png"):
        assert refused(request(image(url))) == (400, "image_url_refused", "messages[0].content[1].image_url.url")
    # an operator switch does not make this version fetch: still refused, saying why
    found = refusal(request(image("https://example.com/a.png")).images(), model="m", sees_images=True,
                    limits=ImageLimits(allow_fetch=True))
    assert found is not None and "not fetched by this version" in found.message
