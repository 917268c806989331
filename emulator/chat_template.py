"""The emulated model's vocabulary and chat template: what a prompt costs in tokens.

Vocabulary: OpenAI's cl100k BPE (`compressor.tokenizer.cl100k`, offline) for text, plus
five Llama-3 style special tokens, each ONE id, so template overhead is counted the way
a real Llama-3 server counts it rather than as the dozen BPE pieces of its spelling:

    <|begin_of_text|>=100257  <|end_of_text|>=100258  <|start_header_id|>=100259
    <|end_header_id|>=100260  <|eot_id|>=100261 (the EOS; SGLang's `matched_stop`)

Chat template (Llama-3's, without tool or date preambles):

    <|begin_of_text|>
    for each message:  <|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>
    if add_generation_prompt:  <|start_header_id|>assistant<|end_header_id|>\\n\\n

So a chat prompt costs 1 + Σ(tokens(role) + tokens("\\n\\n" + content) + 3) + 4 tokens:
the gateway's estimate of L_in must add that overhead. Message content may be a string,
null, or a list of parts of which only `{"type":"text","text":...}` parts count (images
and audio cost nothing here). A completion prompt is BOS + its text tokens (vLLM and
SGLang add BOS with `add_special_tokens`), or the given token ids unchanged.

Tools (the documented allowance of compressor/template.py, counted the same there):
`tools` are one more block ahead of the messages, <|start_header_id|>tools<|end_header_id|>
+ "\\n\\n" + one compact JSON object per tool per line + <|eot_id|>; each assistant
`tool_calls` entry is encoded on its own as {"name": …, "arguments": …} after the content.

`--tokenizer hf:<folder>` (`use_tokenizer`) makes prompts cost what that model's
tokenizer.json and chat template make of them (compressor/hf_template.py), ids included;
generated text and /detokenize stay cl100k (the emulated model's output vocabulary).

Failure posture: content of a wrong type raises `TypeError` (the caller answers 400);
decoding an id outside the vocabulary raises `ValueError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from compressor.hf_template import HFTemplate
from compressor.served import load_served
from compressor.template import TOOLS_ROLE, call_json, tool_calls, tools_text
from compressor.tokenizer import cl100k

_served: HFTemplate | None = None  # a real model's template (--tokenizer hf:…); None: cl100k


def use_tokenizer(spec: str) -> None:
    """Count prompts with `spec` (cl100k, or hf:<folder>) from now on, process-wide."""
    global _served
    template = load_served(spec)
    _served = template if isinstance(template, HFTemplate) else None


BOS = 100257
EOT = 100258
START_HEADER = 100259
END_HEADER = 100260
EOS = 100261  # <|eot_id|>: ends every assistant turn, the token generation stops on

SPECIALS: dict[int, str] = {
    BOS: "<|begin_of_text|>",
    EOT: "<|end_of_text|>",
    START_HEADER: "<|start_header_id|>",
    END_HEADER: "<|end_header_id|>",
    EOS: "<|eot_id|>",
}
_TEXT_VOCAB = 100256  # cl100k's ordinary tokens are 0 … 100255


def encode(text: str) -> list[int]:
    return cl100k().encode(text)


def decode(ids: Iterable[int]) -> str:
    """Text of token ids; special ids print as their spelling."""
    out: list[str] = []
    run: list[int] = []
    for i in ids:
        if i in SPECIALS:
            if run:
                out.append(cl100k().decode(run))
                run = []
            out.append(SPECIALS[i])
        elif 0 <= i < _TEXT_VOCAB:
            run.append(i)
        else:
            raise ValueError(f"token id {i} is out of vocabulary")
    if run:
        out.append(cl100k().decode(run))
    return "".join(out)


def message_text(content: Any) -> str:
    """The countable text of one message's `content`."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping):
                if part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                    parts.append(part["text"])
            else:
                raise TypeError("content parts must be objects")
        return "".join(parts)
    raise TypeError("message content must be a string, a list of parts or null")


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """Token ids of a chat prompt under the template above (or the --tokenizer model's)."""
    if _served is not None:
        for m in messages:
            message_text(m.get("content"))  # the same TypeError for a bad content
        return _served.tokenizer.encode(_served.render(messages, tools or ()))
    ids = [BOS]
    if tools:
        ids.append(START_HEADER)
        ids += encode(TOOLS_ROLE)
        ids.append(END_HEADER)
        ids += encode(tools_text(tools))
        ids.append(EOS)
    for m in messages:
        role = m.get("role")
        if not isinstance(role, str):
            raise TypeError("every message needs a string role")
        ids.append(START_HEADER)
        ids += encode(role)
        ids.append(END_HEADER)
        ids += encode("\n\n" + message_text(m.get("content")))
        for call in tool_calls(m):
            ids += encode(call_json(call))
        ids.append(EOS)
    if add_generation_prompt:
        ids.append(START_HEADER)
        ids += encode("assistant")
        ids.append(END_HEADER)
        ids += encode("\n\n")
    return ids


def render_completion(prompt: str | Sequence[int], add_special_tokens: bool = True) -> list[int]:
    """Token ids of one completion prompt: BOS + text, or the ids as given."""
    if isinstance(prompt, str):
        if _served is not None:
            t = _served.tokenizer
            return t.encode_with_specials(prompt) if add_special_tokens else t.encode(prompt)
        return ([BOS] if add_special_tokens else []) + encode(prompt)
    return list(prompt)
