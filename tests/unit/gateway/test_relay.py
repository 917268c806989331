import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.relay import StreamScanner, token_events, usage_of

ROLE = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOK = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi \\"usage\\""}}]}\n\n'
USAGE = b'data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5}}\n\n'
DONE = b"data: [DONE]\n\n"
STREAM = ROLE + TOK + TOK + USAGE + DONE


def run(scanner: StreamScanner, chunks: list[bytes]) -> bytes:
    out = b"".join(scanner.feed(c) for c in chunks)
    return out + scanner.flush()


def test_usage_kept_when_client_asked():
    s = StreamScanner(strip_usage=False)
    assert run(s, [STREAM]) == STREAM
    assert s.usage == {"prompt_tokens": 12, "total_tokens": 17, "completion_tokens": 5}
    assert s.done


def test_usage_stripped_when_we_asked():
    s = StreamScanner(strip_usage=True)
    assert run(s, [ROLE, TOK, TOK, USAGE, DONE]) == ROLE + TOK + TOK + DONE
    assert s.usage is not None and s.usage["completion_tokens"] == 5


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=12), st.booleans())
def test_any_split_gives_the_same_bytes(cuts, strip):
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    s = StreamScanner(strip_usage=strip)
    expected = ROLE + TOK + TOK + DONE if strip else STREAM
    assert run(s, chunks) == expected
    assert s.usage is not None and s.usage["prompt_tokens"] == 12


def test_complete_events_are_not_held_back():
    s = StreamScanner(strip_usage=True)
    assert s.feed(ROLE + TOK[:10]) == ROLE  # only the partial event waits
    assert s.feed(TOK[10:]) == TOK


def test_usage_of_whole_body():
    body = orjson.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    assert usage_of(body) == {"prompt_tokens": 3, "completion_tokens": 4}
    assert usage_of(b"not json") is None
    assert usage_of(b"[1,2]") is None


def _sse(*objs: object) -> bytes:
    return b"".join(b"data: " + orjson.dumps(o) + b"\n\n" for o in objs)


def test_token_events_skip_the_role_only_first_events():
    """A dp_group rank's load counts generated tokens: vLLM's chat stream opens with a
    role-only delta (one per choice with n > 1), which carries none."""
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    role1 = {"choices": [{"index": 1, "delta": {"role": "assistant", "content": ""}}]}
    tok = {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}
    assert token_events(_sse(role), started=False) == 0
    assert token_events(_sse(role, role1, tok, tok), started=False) == 2
    assert token_events(_sse(tok), started=True) == 1
    # a completion's text, a reasoning delta, tool calls: tokens
    assert token_events(_sse({"choices": [{"text": "a"}]}), started=False) == 1
    reasoning = {"choices": [{"delta": {"role": "assistant", "reasoning_content": "x"}}]}
    assert token_events(_sse(reasoning), started=False) == 1
    assert token_events(b"data: [DONE]\n\n", started=False) == 0
    # the same stream split into the feeds the scanner returns: 3 tokens in all
    scanner = StreamScanner(strip_usage=False)
    whole = _sse(role, tok, tok, tok) + b"data: [DONE]\n\n"
    n = 0
    for i in range(0, len(whole), 37):
        n += token_events(scanner.feed(whole[i : i + 37]), started=n > 0)
    assert n == 3
