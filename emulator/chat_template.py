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

from compressor.chat_ids import (
    BOS as BOS,
)
from compressor.chat_ids import (
    END_HEADER as END_HEADER,
)
from compressor.chat_ids import (
    EOS as EOS,
)
from compressor.chat_ids import (
    EOT as EOT,
)
from compressor.chat_ids import (
    SPECIALS as SPECIALS,
)
from compressor.chat_ids import (
    START_HEADER as START_HEADER,
)
from compressor.chat_ids import (
    chat_ids,
    completion_ids,
)
from compressor.chat_ids import (
    encode as encode,
)
from compressor.chat_ids import (
    message_text as message_text,
)
from compressor.hf_template import HFTemplate
from compressor.served import load_served
from compressor.tokenizer import cl100k

_served: HFTemplate | None = None  # a real model's template (--tokenizer hf:…); None: cl100k


def use_tokenizer(spec: str) -> None:
    """Count prompts with `spec` (cl100k, or hf:<folder>) from now on, process-wide."""
    global _served
    template = load_served(spec)
    _served = template if isinstance(template, HFTemplate) else None


_TEXT_VOCAB = 100256  # cl100k's ordinary tokens are 0 … 100255


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


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """Token ids of a chat prompt under the template above (or the --tokenizer model's)."""
    return chat_ids(messages, add_generation_prompt, tools, _served)


def render_completion(prompt: str | Sequence[int], add_special_tokens: bool = True) -> list[int]:
    """Token ids of one completion prompt: BOS + text, or the ids as given."""
    return completion_ids(prompt, add_special_tokens, _served)
