"""A small OpenAI-compatible chat-completions server acting as a reference-guided judge.

No capable LLM judge exists offline, so the harness (bench and tests) stands one up that reads
the judge prompt like a careful grader with the reference answer at hand: token F1 against the
reference, minus a penalty for rambling far past the reference's length. It speaks the real wire
format over real HTTP, so the gate's endpoint client is exercised end to end. Modes for bad-input
tests: `garbage` (never a verdict), `slow` (answers after `delay_s`), `broken` (HTTP 500)."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pydantic import BaseModel, ConfigDict
from whetstone.eval.domain.textmetrics import token_f1

_SECTION = re.compile(r"\[The Start of (Reference Answer|Assistant A's Answer|Assistant B's Answer)\]\n(.*?)\n"
                      r"\[The End of", re.S)


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str | None = None
    text: str = ""


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    content: str | list[_Part] | None = ""


class _JudgeRequest(BaseModel):
    """The fields of a chat completions request the judge reads: the model and the last message."""
    model_config = ConfigDict(extra="ignore")
    model: str = "judge"
    messages: list[_Message] = [_Message()]


def grade(prompt: str) -> str:
    sections = {k: v for k, v in _SECTION.findall(prompt)}
    ref = sections.get("Reference Answer", "")
    scores = []
    for key in ("Assistant A's Answer", "Assistant B's Answer"):
        answer = sections.get(key, "")
        # conciseness: rambling far past the reference's length costs up to a full point
        penalty = min(1.0, max(0, len(answer) - 3 * len(ref) - 20) / 100)
        scores.append(token_f1(answer, ref) - penalty)
    a, b = scores
    verdict = "C" if abs(a - b) < 0.1 else ("A" if a > b else "B")
    return f"Compared with the reference, A scores {a:.2f} and B scores {b:.2f}. [[{verdict}]]"


class JudgeServer:
    def __init__(self, mode: str = "reference", delay_s: float = 0.0):
        self.mode, self.delay_s, self.requests = mode, delay_s, 0
        self.images_seen = 0          # image parts received (a judge that sees images)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                server.requests += 1
                body = _JudgeRequest.model_validate_json(
                    self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                if not self.path.endswith("/chat/completions"):
                    return self._send(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
                if server.mode == "broken":
                    return self._send(500, {"error": {"message": "judge exploded", "type": "server_error"}})
                if server.mode == "slow":
                    time.sleep(server.delay_s)
                content = body.messages[-1].content if body.messages else ""
                if isinstance(content, list):    # a judge that sees images: text part, then image parts
                    server.images_seen += sum(part.type == "image_url" for part in content)
                    prompt = "".join(part.text for part in content if part.type == "text")
                else:
                    prompt = content or ""
                text = "Both answers have merits; hard to say." if server.mode == "garbage" else grade(prompt)
                self._send(200, {"id": "chatcmpl-judge", "object": "chat.completion", "created": int(time.time()),
                                 "model": body.model,
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": text}}],
                                 "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> JudgeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
