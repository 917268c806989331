import pytest

from gateway.errors import InvalidRequest
from gateway.openai_request import CHAT, COMPLETIONS, parse


def chat(body: str):
    return parse(body.encode(), CHAT)


def test_chat_ok():
    r = chat(
        '{"model":"m","messages":[{"role":"system","content":"héllo"},{"role":"user","content":[{"type":"text","text":"abc"}]}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true},"extra":1}'
    )
    assert (r.model, r.stream, r.wants_usage, r.max_tokens, r.n_messages) == ("m", True, True, 5, 2)
    assert r.prompt_bytes == len("héllo".encode()) + 3
    assert r.body["extra"] == 1  # unknown fields pass through


def test_max_completion_tokens_wins_for_chat():
    assert (
        chat(
            '{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":5,"max_completion_tokens":7}'
        ).max_tokens
        == 7
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ('{"messages":[{"role":"user","content":"x"}]}', "model"),
        ('{"model":3,"messages":[{"role":"user","content":"x"}]}', "model"),
        ('{"model":"m"}', "messages"),
        ('{"model":"m","messages":[]}', "messages"),
        ('{"model":"m","messages":["hi"]}', "messages[0]"),
        ('{"model":"m","messages":[{"content":"x"}]}', "messages[0].role"),
        ('{"model":"m","messages":[{"role":"user","content":5}]}', "messages[0].content"),
        ('{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}', "max_tokens"),
        ('{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":"5"}', "max_tokens"),
        (
            '{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":true}',
            "max_tokens",
        ),
        ('{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}', "stream"),
        (
            '{"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":1}',
            "stream_options",
        ),
    ],
)
def test_chat_refusals_name_the_field(body, param):
    with pytest.raises(InvalidRequest) as e:
        chat(body)
    assert e.value.param == param
    assert e.value.status == 400


@pytest.mark.parametrize("raw", [b"", b"{", b"[1]", b'"x"', b"\xff\xfe"])
def test_malformed_json(raw):
    with pytest.raises(InvalidRequest):
        parse(raw, CHAT)


def test_completions_prompt_forms():
    assert parse(b'{"model":"m","prompt":"abcd"}', COMPLETIONS).prompt_bytes == 4
    assert parse(b'{"model":"m","prompt":["ab","abcdef"]}', COMPLETIONS).prompt_bytes == 6
    assert parse(b'{"model":"m","prompt":[1,2,3]}', COMPLETIONS).prompt_token_ids == 3
    assert parse(b'{"model":"m","prompt":[[1],[1,2]]}', COMPLETIONS).prompt_token_ids == 2
    for bad in (
        b'{"model":"m"}',
        b'{"model":"m","prompt":""}',
        b'{"model":"m","prompt":[]}',
        b'{"model":"m","prompt":[1,"a"]}',
        b'{"model":"m","prompt":{}}',
    ):
        with pytest.raises(InvalidRequest, match="prompt"):
            parse(bad, COMPLETIONS)


def test_prompt_text_ascii_flag():
    assert parse(b'{"model":"m","messages":[{"role":"user","content":"hello"}]}', CHAT).prompt_ascii
    zh = '{"model":"m","messages":[{"role":"user","content":"你好"}]}'.encode()
    p = parse(zh, CHAT)
    assert not p.prompt_ascii and p.prompt_bytes == 6
    assert not parse('{"model":"m","prompt":["a","é"]}'.encode(), "completions").prompt_ascii


def test_choices_and_prompts_count_what_the_engine_runs():
    """n and best_of (the larger) are the sequences per prompt; a batch of prompts is
    counted; values the engine would refuse count as 1 (its 400 passes through)."""
    base = '"model":"m","messages":[{"role":"user","content":"x"}]'
    assert (chat("{" + base + "}").choices, chat("{" + base + "}").prompts) == (1, 1)
    assert chat("{" + base + ',"n":64}').choices == 64
    assert chat("{" + base + ',"n":2,"best_of":5}').choices == 5
    assert chat("{" + base + ',"n":"x"}').choices == 1
    assert chat("{" + base + ',"n":0}').choices == 1
    assert chat("{" + base + ',"n":true}').choices == 1
    r = parse(b'{"model":"m","prompt":["a","bb","ccc"],"n":3}', COMPLETIONS)
    assert (r.prompts, r.choices) == (3, 3)
    r = parse(b'{"model":"m","prompt":[[1,2],[3],[4,5,6]]}', COMPLETIONS)
    assert r.prompts == 3
    assert parse(b'{"model":"m","prompt":[1,2,3]}', COMPLETIONS).prompts == 1
    assert parse(b'{"model":"m","prompt":"abc"}', COMPLETIONS).prompts == 1
