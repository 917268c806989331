"""What the cache-aware routers read of a request, filled before the core starts it
(docs/CACHE_ROUTING.md), as the simulator fills them from its workload.

- `prefix_hashes`: chained hashes of the prompt's `PREFIX_BLOCK_BYTES`-byte chunks
  (policies/prefix_index.py `byte_block_hashes`: BLAKE2b-64, the same in every process
  and gateway replica) of the serialised `messages` — or of the completion prompt's text,
  or of its token ids as JSON. The gateway's counters give token counts, not ids, so the
  chunks are bytes: one per ~128 tokens, and the routers' `hash_block_tokens` is set to
  PREFIX_BLOCK_BYTES / 4 for them (gateway/proxy.py `core_spec`). A conversation's next
  turn serialises its earlier messages to the same leading bytes, so it shares their
  chunks.
- `session`: the `x-fleetgate-session` header, else the body's `user` field (OpenAI's
  end-user id); at most `MAX_SESSION_BYTES`, longer keys are cut (they only pick a point
  on a hash ring).
- `router_temperature` / `overlap_weight`: the `x-fleetgate-router-temperature` and
  `x-fleetgate-overlap-weight` headers, a number >= 0 each (400 otherwise), overriding the
  pool's kv_cost (τ, ω) for this request (Dynamo's `router_config_override`).

With `kv_events` on a pool (its engines publish their KV-cache events), `prefix_hashes` are
instead chained hashes of the prompt's token ids per KV block (`token_hasher`), the chain
the event consumer (gateway/kv_events.py) keeps the index in.

Only what a configured router reads is computed (`policies.build.request_fields`): with
the default routing none of this runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection

import orjson

from compressor.chat_ids import MessageIdsCache, chat_ids, completion_ids
from compressor.hf_template import HFTemplate
from compressor.template import ServedTemplate
from gateway.errors import InvalidRequest
from gateway.openai_request import CHAT, ParsedRequest
from policies.events import Request
from policies.prefix_index import byte_block_hashes, token_block_hashes

PREFIX_BLOCK_BYTES = 512  # one chained hash per this many prompt bytes (~128 tokens)
HASH_BLOCK_TOKENS = PREFIX_BLOCK_BYTES // 4  # the tokens a chunk stands for (~4 bytes each)
MAX_SESSION_BYTES = 256
# with kv_events, a request body longer than this is token-hashed on a thread (the driver)
OFF_LOOP_BYTES = 8192
SESSION_HEADER = "x-fleetgate-session"
TEMPERATURE_HEADER = "x-fleetgate-router-temperature"
OVERLAP_HEADER = "x-fleetgate-overlap-weight"


def prompt_bytes(parsed: ParsedRequest) -> bytes:
    """The bytes a prompt's chunks are cut from: the messages as JSON (chat), the prompt's
    text, or a prompt given as token ids (or a batch) as JSON."""
    body = parsed.body
    if parsed.endpoint == CHAT:
        return orjson.dumps(body.get("messages"))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt.encode("utf-8", "surrogatepass")
    return orjson.dumps(prompt) if isinstance(prompt, list) else b""


def prompt_hashes(parsed: ParsedRequest) -> tuple[int, ...]:
    """Chained hashes of the prompt's full PREFIX_BLOCK_BYTES-byte chunks."""
    return byte_block_hashes(prompt_bytes(parsed), PREFIX_BLOCK_BYTES)


def token_hasher(
    served: ServedTemplate | None, block_size: int
) -> Callable[[ParsedRequest], tuple[int, ...]]:
    """Prefix hashes from token ids, for pools whose engines publish KV events: the prompt
    rendered and encoded as the engine does (compressor/chat_ids.py; `served` a real
    model's template, else the emulated model's) and chained per `block_size` tokens —
    the chain the event consumer rebuilds from the engines' `token_ids`. Only with
    `kv_events`. Under the emulated model's template the messages' ids are cached
    (`MessageIdsCache`, ~10 MB at most): a conversation's next turn encodes only its new
    messages; a served (`hf:`) template renders and encodes the whole prompt each time."""
    template = served if isinstance(served, HFTemplate) else None
    cache = MessageIdsCache() if template is None else None

    def hashes(parsed: ParsedRequest) -> tuple[int, ...]:
        body = parsed.body
        try:
            if parsed.endpoint == CHAT:
                ids = chat_ids(
                    body.get("messages") or (),
                    bool(body.get("add_generation_prompt", True)),
                    body.get("tools"),
                    template,
                    cache,
                )
            else:
                prompt = body.get("prompt")
                if not isinstance(prompt, str) and not (
                    isinstance(prompt, list) and all(type(t) is int for t in prompt)
                ):
                    return ()  # a batch: no one chain
                ids = completion_ids(prompt, bool(body.get("add_special_tokens", True)), template)
        except (TypeError, ValueError, AttributeError):
            return ()  # not renderable: the engine will say why
        return token_block_hashes(ids, block_size)

    return hashes


def _weight(raw: bytes, header: str) -> float:
    try:
        value = float(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        value = -1.0
    if not (value >= 0.0 and math.isfinite(value)):
        raise InvalidRequest(f"{header}: must be a number >= 0", param=header)
    return value


def describe(
    request: Request,
    parsed: ParsedRequest,
    fields: Collection[str],
    session: bytes | None,
    temperature: bytes | None,
    overlap: bytes | None,
    hasher: Callable[[ParsedRequest], tuple[int, ...]] = prompt_hashes,
) -> None:
    """Set the `fields` the routers read (module docstring) on the core's `request`."""
    if "prefix_hashes" in fields and not request.prefix_hashes:
        request.prefix_hashes = hasher(parsed)
    if "session" in fields:
        if session:
            request.session = session[:MAX_SESSION_BYTES].decode("utf-8", "replace")
        else:
            user = parsed.body.get("user")
            if isinstance(user, str) and user:
                request.session = user[:MAX_SESSION_BYTES]
    if "router_temperature" in fields and temperature is not None:
        request.router_temperature = _weight(temperature, TEMPERATURE_HEADER)
    if "overlap_weight" in fields and overlap is not None:
        request.overlap_weight = _weight(overlap, OVERLAP_HEADER)
