import pytest

from whetstone.modelkit.tiny import TOOL_CHAT_TEMPLATE

from whetstone.modelkit.chat import IGNORE_INDEX, ChatFormatError, mask_preview, tokenize_chat

pytestmark = pytest.mark.unit

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Spain?"},
    {"role": "assistant", "content": "Madrid."},
]


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _trained_ids(example):
    return [label for label in example["labels"] if label != IGNORE_INDEX]


def test_only_assistant_content_and_end_of_turn_are_trained(tokenizer):
    example = tokenize_chat(tokenizer, CONVERSATION, max_len=512)
    rendered = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)

    assert example["input_ids"] == _ids(tokenizer, rendered)
    assert len(example["labels"]) == len(example["input_ids"]) == len(example["attention_mask"])
    expected = _ids(tokenizer, "The capital of France is Paris.<|end|>") + _ids(tokenizer, "Madrid.<|end|>")
    assert _trained_ids(example) == expected
    # trained labels equal the input ids at their positions, everything else is ignored
    for token, label in zip(example["input_ids"], example["labels"]):
        assert label in (token, IGNORE_INDEX)
    assistant_header = tokenizer.convert_tokens_to_ids("<|assistant|>")
    assert assistant_header not in _trained_ids(example)


def test_mask_preview_brackets_trained_spans(tokenizer):
    preview = mask_preview(tokenizer, CONVERSATION[1:3])
    assert preview == (
        "<|bos|><|user|>\nWhat is the capital of France?<|end|>\n"
        "<|assistant|>\n[[The capital of France is Paris.<|end|>]]\n"
    )


def test_weight_zero_assistant_is_not_trained_and_weight_one_user_is(tokenizer):
    messages = [
        {"role": "user", "content": "Say hi", "weight": 1},
        {"role": "assistant", "content": "Hi!", "weight": 0},
        {"role": "user", "content": "Again"},
        {"role": "assistant", "content": "Hello again."},
    ]
    example = tokenize_chat(tokenizer, messages, max_len=512)
    assert _trained_ids(example) == _ids(tokenizer, "Say hi<|end|>") + _ids(tokenizer, "Hello again.<|end|>")
    assert "[[Say hi<|end|>]]" in mask_preview(tokenizer, messages)
    assert "\nHi!<|end|>" in mask_preview(tokenizer, messages)


def test_truncation_keeps_the_start(tokenizer):
    full = tokenize_chat(tokenizer, CONVERSATION, max_len=None)
    short = tokenize_chat(tokenizer, CONVERSATION, max_len=20)
    assert short["input_ids"] == full["input_ids"][:20]
    assert short["labels"] == full["labels"][:20]
    assert _trained_ids(short) == []  # the first answer starts after token 20


def test_template_that_is_not_prefix_stable_falls_back_to_content_search(tokenizer):
    import copy

    quirky = copy.deepcopy(tokenizer)
    # the LAST message gets an extra suffix: prefixes of the conversation are not prefixes of its render
    quirky.chat_template = (
        "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>' }}"
        "{% if loop.last %}{{ '<|eos|>' }}{% endif %}{{ '\\n' }}{% endfor %}"
    )
    example = tokenize_chat(quirky, CONVERSATION, max_len=512)
    expected = _ids(tokenizer, "The capital of France is Paris.<|end|>") + _ids(tokenizer, "Madrid.<|end|>")
    assert _trained_ids(example) == expected


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "weight": 0.5}],
        [{"role": "user", "content": None}],
    ],
)
def test_malformed_conversations_raise(tokenizer, messages):
    with pytest.raises(ChatFormatError):
        tokenize_chat(tokenizer, messages, max_len=64)


def test_trained_user_message_whose_content_repeats_its_role_name(tokenizer):
    messages = [{"role": "user", "content": "user", "weight": 1}, {"role": "assistant", "content": "assistant"}]
    assert mask_preview(tokenizer, messages) == "<|bos|><|user|>\n[[user<|end|>]]\n<|assistant|>\n[[assistant<|end|>]]\n"




def test_tool_calls_are_trained_and_tool_results_are_not(tokenizer):
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = TOOL_CHAT_TEMPLATE
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "France"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Paris"},
        {"role": "assistant", "content": "Madrid."},
    ]
    example = tokenize_chat(tok, messages, tools=tools)
    trained = tok.decode(_trained_ids(example))
    # the JSON-string arguments reach the template as a dict (rendered by tojson), the call is trained
    assert trained == 'lookup{"q": "France"}<|end|>Madrid.<|end|>'
    assert "[[lookup" in mask_preview(tok, messages, tools=tools)
    with pytest.raises(ChatFormatError):
        tokenize_chat(tok, [{"role": "user", "content": "x"}, {"role": "assistant", "content": None}])
