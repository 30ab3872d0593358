"""http(s) image URLs in a training file (issue 37): refused while the operator has fetching off;
with it on, fetched once at validation from public addresses only (loopback, link-local metadata,
private: refused with the line and the reason, nothing fetched), and the row rewritten to a data
URL of what was fetched, which the trainer opens without fetching. The allowed fetch goes to a
loopback test server the operator allow-lists (as webhook tests do)."""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image

from whetstone.ingest.config import IngestSettings

pytestmark = pytest.mark.integration
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}


def png(rgb: tuple[int, int, int], size: int = 16) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), rgb).save(buf, "PNG")
    return buf.getvalue()


def row(url: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": f"Which colour? ({answer})"},
                                                      {"type": "image_url", "image_url": {"url": url}}]},
                         {"role": "assistant", "content": answer}]}


def inline_rows(n: int) -> list[dict]:
    return [row("data:image/png;base64," + base64.b64encode(png((i * 20, 100, 50), 8 + i)).decode(), f"inline {i}")
            for i in range(n)]


@pytest.fixture
def server() -> Iterator[tuple[int, list[str]]]:
    """A loopback image server: /<colour>.png, /moved (a redirect), /anim.gif; the paths it was asked for."""
    asked: list[str] = []
    gif = io.BytesIO()
    Image.new("RGB", (4, 4)).save(gif, "GIF")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            asked.append(self.path)
            name = self.path.strip("/").removesuffix(".png")
            if self.path == "/moved":
                self.send_response(302)
                self.send_header("Location", "http://169.254.169.254/")
                self.end_headers()
                return
            body = png(COLOURS[name]) if name in COLOURS else gif.getvalue() if self.path == "/anim.gif" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "image/png" if name in COLOURS else "image/gif")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1], asked
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_private_image_urls_are_refused_with_line_and_reason_and_nothing_is_fetched(tmp_path, kit, server):
    port, asked = server
    bad = [f"https://127.0.0.1:{port}/red.png", f"http://127.0.0.1:{port}/red.png",
           "http://169.254.169.254/latest/meta-data/", f"http://0x7f000001:{port}/red.png",
           f"http://[::ffff:127.0.0.1]:{port}/red.png", "https://10.1.2.3/red.png", "http://localhost/red.png"]
    rows = inline_rows(10) + [row(url, "red") for url in bad]
    off = kit.run_gate(kit.write_jsonl(tmp_path / "off.jsonl", rows), tmp_path / "off").report.as_dict()
    assert {e["line"]: e["code"] for e in off["errors"]} == {11 + i: "image_url_refused" for i in range(len(bad))}
    assert all("fetching image URLs is not enabled" in e["message"] for e in off["errors"])

    on = IngestSettings(image_fetch=True)
    r = kit.run_gate(kit.write_jsonl(tmp_path / "on.jsonl", rows), tmp_path / "on", settings=on).report.as_dict()
    got = {e["line"]: e for e in r["errors"]}
    assert sorted(got) == list(range(11, 11 + len(bad))) and {e["code"] for e in got.values()} == {
        "image_fetch_refused"}, r["errors"]
    assert all(e["field"] == "messages[0].content[1]" for e in got.values())
    assert "loopback" in got[11]["message"] and "loopback" in got[12]["message"]
    assert "link-local" in got[13]["message"] and "image URLs reach only public addresses" in got[13]["message"]
    assert "loopback" in got[14]["message"] and "IPv4 address inside IPv6" in got[15]["message"]
    assert "private" in got[16]["message"] and "not a public host name" in got[17]["message"]
    assert asked == []                        # nothing was asked of the loopback server


def test_allowed_image_urls_are_fetched_once_stored_in_the_rows_and_trained_without_fetching(tmp_path, kit, server):
    from whetstone.modelkit.vision import open_image

    port, asked = server
    settings = IngestSettings(image_fetch=True, image_fetch_allow_hosts=[f"127.0.0.1:{port}"])
    fetched = [row(f"http://127.0.0.1:{port}/{name}.png", name) for name in COLOURS]
    refused = [row(f"http://127.0.0.1:{port}/moved", "moved"), row(f"http://127.0.0.1:{port}/anim.gif", "gif"),
               row(f"http://127.0.0.1:{port + 1 if port < 65535 else port - 1}/red.png", "other port")]
    rows = inline_rows(10) + fetched + refused
    result = kit.run_gate(kit.write_jsonl(tmp_path / "d.jsonl", rows), tmp_path, settings=settings)
    r = result.report.as_dict()
    got = {e["line"]: e for e in r["errors"]}
    assert sorted(got) == [14, 15, 16], r["errors"]
    assert "redirects are not followed" in got[14]["message"] and "GIF" in got[15]["message"]
    assert "loopback" in got[16]["message"]            # the allow-list names one port
    assert sorted(asked) == ["/anim.gif", "/blue.png", "/green.png", "/moved", "/red.png"]   # each once
    assert r["images"]["images"] == 13
    out = kit.read_jsonl(result.train_path) + (kit.read_jsonl(result.validation_path)
                                               if result.validation_path else [])
    assert "http://" not in json.dumps(out)
    stored = {o["messages"][-1]["content"]: o["messages"][0]["content"][1]["image_url"]["url"] for o in out}
    asked.clear()
    for name, rgb in COLOURS.items():
        assert stored[name].startswith("data:image/png;base64,")
        assert base64.b64decode(stored[name].partition(",")[2]) == png(rgb)
        assert open_image(stored[name]).getpixel((3, 3)) == rgb     # what the trainer's collator opens
    assert asked == []
