"""`MessageIdsCache` (compressor/chat_ids.py): a conversation's messages rendered once.
The oracle is `chat_ids` without a cache (every message encoded afresh)."""

from __future__ import annotations

import random
import threading

from compressor.chat_ids import MessageIdsCache, chat_ids

WORDS = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "w123", "café"]


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversation(seed: int, turns: int) -> list[list[dict[str, object]]]:
    """The prompts of a conversation's turns, each the whole conversation so far."""
    rng = random.Random(seed)
    messages: list[dict[str, object]] = [{"role": "system", "content": text(rng, 300)}]
    prompts = []
    for _ in range(turns):
        messages.append({"role": "user", "content": text(rng, 20)})
        prompts.append(list(messages))
        messages.append({"role": "assistant", "content": text(rng, 60)})
    return prompts


def test_a_conversations_turns_are_rendered_as_without_the_cache_and_hit_it():
    cache = MessageIdsCache()
    for turn, prompt in enumerate(conversation(1, 5)):
        assert chat_ids(prompt, cache=cache) == chat_ids(prompt)
        # turn k (from 0) holds 2k + 2 messages; 2 are new to the cache (the first
        # turn's system prompt and question; later, the question and the last answer)
        assert cache.misses == 2 + 2 * turn and cache.hits == turn * (turn + 1)  # Σ 2j
    assert len(cache) == 10 and chat_ids(prompt, False, cache=cache) == chat_ids(prompt, False)


def test_tool_calls_and_tools_are_rendered_without_the_cache():
    cache = MessageIdsCache()
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "call f"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    for _ in range(2):
        assert chat_ids(messages, True, tools, cache=cache) == chat_ids(messages, True, tools)
    assert len(cache) == 2 and cache.hits == 2  # the message with tool calls is not kept


def test_the_cache_never_holds_more_than_its_tokens_least_recent_first():
    rng = random.Random(2)
    cache = MessageIdsCache(max_tokens=400)
    hot = {"role": "system", "content": text(rng, 100)}
    for _ in range(60):
        other = {"role": "user", "content": text(rng, rng.randint(1, 150))}
        prompt = [hot, other]
        assert chat_ids(prompt, cache=cache) == chat_ids(prompt)
        assert cache.tokens <= 400
        assert cache.tokens == sum(len(v) for v in cache._entries.values())
    assert ("system", hot["content"]) in cache._entries  # used every time: never evicted
    huge = {"role": "user", "content": text(rng, 2000)}  # longer than the whole bound
    assert chat_ids([huge], cache=cache) == chat_ids([huge]) and cache.tokens <= 400
    assert ("user", huge["content"]) not in cache._entries


def test_threads_sharing_a_cache_render_as_without_it():
    cache = MessageIdsCache(max_tokens=3000)
    prompts = [p for seed in range(6) for p in conversation(seed, 4)]
    expected = [chat_ids(p) for p in prompts]
    failures: list[int] = []

    def work(k: int) -> None:
        order = list(range(len(prompts)))
        random.Random(k).shuffle(order)
        for _ in range(3):
            failures.extend(i for i in order if chat_ids(prompts[i], cache=cache) != expected[i])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [] and cache.tokens <= 3000
