"""The validation file eval reads is the split ingest wrote: its chat and preference schemas."""

import json

import pytest
from whetstone.eval.adapters.holdout import HoldoutError, read_holdout
from whetstone.eval.domain.rows import Turn

pytestmark = pytest.mark.unit


def _file(tmp_path, rows):
    path = tmp_path / "v.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_ingest_preference_rows_score_the_chosen_answer(tmp_path):
    row = {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}],
           "chosen": [{"role": "assistant", "content": "4"}], "rejected": [{"role": "assistant", "content": "5"}]}
    [r] = read_holdout(_file(tmp_path, [row]), 10)
    prompt = [Turn("system", "Be brief."), Turn("user", "2 + 2?")]
    assert r.reference == "4" and r.prompt == prompt and r.messages == [*prompt, Turn("assistant", "4")]


@pytest.mark.parametrize("row,expect", [
    ({"prompt": [], "chosen": [{"role": "assistant", "content": "4"}]}, "line 1: 'prompt' must be a list"),
    ({"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant"}]}, "chosen[0] needs string"),
    ({"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "user", "content": "a"}]},
     "last message must be the assistant"),
    ({"chosen": "4", "rejected": "5"}, "expected 'messages' (chat) or 'prompt' + 'chosen'"),
])
def test_bad_preference_rows_name_the_line_and_field(tmp_path, row, expect):
    with pytest.raises(HoldoutError) as err:
        read_holdout(_file(tmp_path, [row]), 10)
    assert expect in str(err.value)


def _image(data: bytes, media: str = "image/png") -> dict:
    import base64

    return {"type": "image_url", "image_url": {"url": f"data:{media};base64," + base64.b64encode(data).decode()}}


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, "PNG")
    return buf.getvalue()


def test_image_rows_keep_their_parts_in_order_and_their_text(tmp_path):
    image = _image(_png())
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Which colour?"}, image]},
                        {"role": "assistant", "content": "red"}]}
    [r] = read_holdout(_file(tmp_path, [row]), 10)
    [user] = r.prompt
    assert user.content == "Which colour?" and user.parts[0] == "Which colour?"
    assert [i.url for i in user.images] == [image["image_url"]["url"]] and r.reference == "red" and r.has_images


@pytest.mark.parametrize("part,expect", [
    (_image(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10), "line 1: messages[0].content[1]"),
    (_image(b"GIF89a" + b"\0" * 20, "image/gif"), "messages[0].content[1]"),
    ({"type": "image_url", "image_url": {"url": "https://127.0.0.1/x.png"}}, "messages[0].content[1]"),
    ({"type": "image_url"}, "messages[0].content[1]: the image_url part needs its 'image_url' field"),
    ({"type": "audio", "audio": "x"}, "messages[0].content[1]: part type 'audio' is not supported"),
])
def test_bad_image_parts_name_the_line_and_part(tmp_path, part, expect):
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Which colour?"}, part]},
                        {"role": "assistant", "content": "red"}]}
    with pytest.raises(HoldoutError) as err:
        read_holdout(_file(tmp_path, [row]), 10)
    assert expect in str(err.value)


def test_an_image_in_the_answer_is_refused(tmp_path):
    row = {"messages": [{"role": "user", "content": "Draw red."},
                        {"role": "assistant", "content": [_image(_png())]}]}
    with pytest.raises(HoldoutError, match="line 1: messages\\[1\\]: images are only allowed in user messages"):
        read_holdout(_file(tmp_path, [row]), 10)
