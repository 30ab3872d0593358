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
    # where the operator allows fetching, an http(s) URL passes the up-front rules (read_images fetches it)
    assert refusal(request(image("https://example.com/a.png")).images(), model="m", sees_images=True,
                   limits=ImageLimits(allow_fetch=True)) is None
    assert refused(request(image("ftp://x/a.png")), limits=ImageLimits(allow_fetch=True))[1] == "image_url_refused"


def test_fetched_images_follow_ingest_address_rules():
    """With fetching on, a chat image URL is fetched under ingest's rules: loopback and the metadata
    address refused naming the part (nothing asked of the server); an allow-listed loopback server's
    image handed to the model as a data URL of its bytes."""
    import base64
    import io
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from PIL import Image

    from whetstone.serving.domain.images import ImageRefused
    from whetstone.serving.usecases.inference import read_images

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, "PNG")
    asked = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(buf.getvalue())))
            self.end_headers()
            self.wfile.write(buf.getvalue())

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/red.png"
    inline = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    try:
        for bad in (url, "http://169.254.169.254/latest/meta-data/", url.replace("http:", "https:")):
            with pytest.raises(ImageRefused) as exc:
                read_images(request(image(inline), image(bad)).images(), ImageLimits(allow_fetch=True))
            assert exc.value.code == "image_fetch_refused" and exc.value.param == "messages[0].content[2].image_url.url"
            assert "not public" in exc.value.message
        assert asked == []
        allowed = ImageLimits(allow_fetch=True, fetch_allow_hosts=(f"127.0.0.1:{httpd.server_address[1]}",))
        [got] = read_images(request(image(url)).images(), allowed)
        assert got == inline and asked == ["/red.png"]
    finally:
        httpd.shutdown()
        httpd.server_close()
