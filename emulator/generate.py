"""POST /v1/chat/completions and /v1/completions: plan, run on the engine, answer.

Per request: validate and plan (emulator/requests.py; refusals are answered before the
engine sees anything), inject configured faults, submit one engine request per choice,
then either collect every choice and answer one JSON body, or stream.

Streaming order (WIRE_SPEC §4): vLLM answers 200 at once and, at the first engine
output, sends one role chunk per choice, then one content chunk per choice per engine
step (one token each), the finish chunk carrying the last token's text ("" for EOS),
then the usage chunk if asked, then `[DONE]`. Each choice's ending (EOS, stop string,
stop token, length) is planned before submission (`SeqPlan.outcome`), so the engine
request ends at exactly that token; a stream shows the text as far as the personality
would (vLLM holds back max(len(stop)) − 1 characters while stop strings are set). SGLang answers only once the first output
exists; its role chunk goes per choice, and its finish reason follows in its own chunk.

Tool calls (vLLM personality, emulator/tools.py): a choice whose plan has a call answers
with it instead of text — whole in the body, or in a stream as the opening DeltaToolCall
then argument parts in proportion to the tokens generated, complete at the finish chunk.

Failure posture: whatever ends the handler — client gone (a failed write, or aiohttp
cancelling the handler on disconnect), an injected cut, an error — every engine request
of this HTTP request is aborted in `finally`, so running/waiting return to zero. An
engine-side abort becomes a 500 (JSON, or an error event before `[DONE]` mid-stream).

With `--role` (emulator/pd.py), a P/D request is that side's part of the pair: a decode
first gets its prompt's KV from the prefill (a failure answers 500, or the error event of
a vLLM stream), a vLLM prefill's answer carries its `kv_transfer_params`, an SGLang
prefill publishes its room when it ends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass

from aiohttp import web

from emulator.dp_engine import requested_rank
from emulator.driver import Event
from emulator.engine import EngineRequest, FinishedRequest
from emulator.metrics import RequestTag
from emulator.pd import KvLoadFailed, Turn, kv_load_error, turn_for
from emulator.requests import GenPlan, SeqPlan, plan
from emulator.sampling import text_slice, token_at, token_logprobs, visible_chars
from emulator.schema import ApiError
from emulator.state import PINNED_RANK, Emulator
from emulator.tools import new_call_id
from emulator.wire import DONE, Choice, Head, TokenLogprob, ToolCall, Usage

log = logging.getLogger("emulator.generate")

INTERNAL = ApiError(500, "Internal server error", "InternalServerError")


@dataclass(slots=True)
class _Choice:
    index: int
    prompt_tokens: int
    seq: SeqPlan
    tokens: int = 0  # generated so far (EOS included)
    sent: int = 0  # characters of the answer already streamed
    fin: FinishedRequest | None = None
    call_id: str = ""  # its tool call's id, when the plan has one
    opened: bool = False  # its tool call's opening delta was streamed


async def generate(
    request: web.Request, emu: Emulator, kind: str, body: object
) -> web.StreamResponse:
    turn = turn_for(request, body)  # None unless this server serves a P/D role
    p = plan(kind, body, request.headers, emu.info)
    rank = request.app.get(PINNED_RANK)  # a per-rank port answers as its rank only
    if rank is None:
        try:
            rank = requested_rank(request.headers, body, emu.vllm)
        except ValueError as exc:
            raise ApiError(400, str(exc), "BadRequestError") from None
    _faults_on_arrival(emu)
    if emu.cfg.faults.error_rate and emu.rng.random() < emu.cfg.faults.error_rate:
        raise INTERNAL
    if emu.cfg.faults.added_latency_ms:
        await asyncio.sleep(emu.cfg.faults.added_latency_ms / 1000)
    head = Head(
        id=p.response_id,
        created=int(time.time()),
        model=p.model,
        chat=kind == "chat",
        include_usage=p.include_usage,
        continuous_usage=p.continuous_usage,
        cache_report=emu.cfg.prompt_tokens_details,
    )
    if turn is not None and turn.receives:
        try:
            await turn.receive()
        except KvLoadFailed as exc:
            log.warning("KV load failed: %s", exc)
            err = kv_load_error(emu, turn)
            if p.stream and emu.vllm:  # after the 200: the error event, then [DONE]
                return await _stream_error(request, emu, p, head, err)
            raise err from None
    queue: asyncio.Queue[Event] = asyncio.Queue()
    choices = {s.index: _Choice(s.index, s.prompt_tokens, s) for s in p.seqs}
    if p.tool is not None:
        for c in choices.values():
            c.call_id = new_call_id()
    ids: list[str] = []
    driver = emu.driver
    try:
        for s in p.seqs:
            eid = driver.new_id()
            tag = RequestTag(streaming=p.stream, max_tokens=s.max_tokens, n=p.n)
            try:
                driver.submit(
                    EngineRequest(
                        eid,
                        s.prompt_tokens,
                        s.max_tokens,
                        s.output_tokens,
                        s.block_hashes,
                        finish_reason=s.outcome.finish_reason,
                        dp_rank=rank,
                        remote_tokens=s.prompt_tokens if turn is not None and turn.receives else 0,
                        token_ids=s.token_ids,
                    ),
                    queue,
                    s.index,
                    tag,
                )
            except ValueError as exc:
                raise ApiError(400, str(exc), "BadRequestError") from None
            ids.append(eid)
        if p.stream:
            return await _stream(request, emu, p, head, queue, choices)
        return await _collect(request, emu, p, head, queue, choices, turn)
    finally:
        for eid in ids:
            driver.abort(eid)
        if turn is not None:
            ok = all(c.fin is not None and c.fin.reason != "abort" for c in choices.values())
            turn.ended(ok, p.seqs[0].prompt_tokens)


async def _stream_error(
    request: web.Request, emu: Emulator, p: GenPlan, head: Head, err: ApiError
) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers=_headers(request, emu, p))
    resp.content_type = "text/event-stream"
    resp.charset = "utf-8"
    await resp.prepare(request)
    await resp.write(emu.wire.stream_error(head, err) + DONE)
    await resp.write_eof()
    return resp


def _faults_on_arrival(emu: Emulator) -> None:
    emu.requests_seen += 1
    n = emu.cfg.faults.crash_after_requests
    if n and emu.requests_seen > n:
        log.error("crash-after-requests=%d reached: exiting", n)
        os._exit(3)


def _headers(request: web.Request, emu: Emulator, p: GenPlan) -> dict[str, str]:
    if emu.vllm and emu.cfg.enable_request_id_headers:
        return {"X-Request-Id": request.headers.get("X-Request-Id") or p.response_id}
    return {}


def _usage(p: GenPlan, choices: dict[int, _Choice]) -> Usage:
    completion = sum(c.tokens for c in choices.values())
    cached = sum(c.fin.cached_tokens for c in choices.values() if c.fin and c.index % p.n == 0)
    return Usage(p.prompt_tokens, completion, cached)


def _logprobs(p: GenPlan, c: _Choice, start: int, stop: int) -> tuple[TokenLogprob, ...] | None:
    """Logprobs of generated tokens [start, stop) of a choice; None if not asked for."""
    if p.top_n is None:
        return None
    out = []
    for pos in range(start, stop):
        _, text = token_at(c.seq.outcome, pos)
        lp, top = token_logprobs(c.seq.key, pos, text, p.top_n)
        out.append(TokenLogprob(text, lp, top))
    return tuple(out)


def _final(p: GenPlan, c: _Choice) -> Choice:
    """The whole answer of a finished choice (non-streamed bodies)."""
    o = c.seq.outcome
    reason = c.fin.reason if c.fin else None
    return Choice(
        c.index,
        o.text,
        _tool_finish(p, reason),
        o.eos,
        o.stop_reason,
        _logprobs(p, c, 0, c.tokens),
        tool_call=None if p.tool is None else ToolCall(c.call_id, p.tool.name, p.tool.arguments),
    )


def _tool_finish(p: GenPlan, reason: str | None) -> str | None:
    """vLLM: a required or auto call that the engine ended by itself says `tool_calls`."""
    if p.tool is not None and reason == "stop":
        return p.tool.finish
    return reason


def _tool_delta(p: GenPlan, c: _Choice, finished: bool) -> ToolCall:
    """The part of the call's arguments a stream shows after `c.tokens` tokens: in
    proportion to the tokens generated, all of it once the choice ends."""
    assert p.tool is not None
    args = p.tool.arguments
    total = max(1, c.seq.output_tokens)
    shown = len(args) if finished else min(len(args), len(args) * c.tokens // total)
    sent = c.sent
    first = sent == 0 and not c.opened
    c.opened = True
    c.sent = max(sent, shown)
    return ToolCall(c.call_id, p.tool.name, args[sent:shown] if shown > sent else "", first)


async def _collect(
    request: web.Request,
    emu: Emulator,
    p: GenPlan,
    head: Head,
    queue: asyncio.Queue[Event],
    choices: dict[int, _Choice],
    turn: Turn | None = None,
) -> web.Response:
    pending = len(choices)
    while pending:
        key, new, fin = await queue.get()
        c = choices[key]
        c.tokens += new
        if fin is not None:
            c.fin = fin
            pending -= 1
            if fin.reason == "abort":
                raise INTERNAL
    out = [_final(p, c) for c in sorted(choices.values(), key=lambda c: c.index)]
    body = emu.wire.full(head, out, _usage(p, choices))
    if turn is not None:
        body = turn.answered(body, p.prompt_tokens, out[0].finish_reason if out else None)
    return web.Response(
        body=body,
        content_type="application/json",
        headers=_headers(request, emu, p),
    )


async def _stream(
    request: web.Request,
    emu: Emulator,
    p: GenPlan,
    head: Head,
    queue: asyncio.Queue[Event],
    choices: dict[int, _Choice],
) -> web.StreamResponse:
    wire = emu.wire
    resp = web.StreamResponse(status=200, headers=_headers(request, emu, p))
    resp.content_type = "text/event-stream"
    resp.charset = "utf-8"
    if emu.vllm:
        await resp.prepare(request)
    cut_after = emu.cfg.faults.die_mid_stream_after
    events = 0
    first = True
    role_sent: set[int] = set()
    pending = len(choices)
    while pending:
        batch = [await queue.get()]
        while not queue.empty():
            batch.append(queue.get_nowait())
        out = bytearray()
        for key, new, fin in batch:
            c = choices[key]
            if head.chat and first and emu.vllm:
                for i in sorted(choices):
                    out += wire.role(head, i, Usage(choices[i].prompt_tokens, 0))
            if head.chat and not emu.vllm and c.index not in role_sent:
                role_sent.add(c.index)
                out += wire.role(head, c.index, Usage(c.prompt_tokens, 0))
            first = False
            start = c.tokens
            c.tokens += new
            if fin is not None:
                c.fin = fin
                pending -= 1
                if fin.reason == "abort":
                    out += wire.stream_error(head, INTERNAL) + DONE
                    pending = 0
                    break
            o = c.seq.outcome
            reason = fin.reason if fin is not None else None
            if p.tool is not None:
                sent, text = c.sent, ""
                call: ToolCall | None = _tool_delta(p, c, fin is not None)
                reason = _tool_finish(p, reason)
            else:
                shown = visible_chars(o, c.tokens, p.holdback)
                sent = c.sent
                text = text_slice(sent, shown) if shown > sent else ""
                c.sent = max(sent, shown)
                call = None
            choice = Choice(
                c.index,
                text,
                reason,
                o.eos,
                o.stop_reason if reason is not None else None,
                _logprobs(p, c, start, c.tokens),
                sent,
                call,
            )
            out += wire.delta(head, choice, Usage(c.prompt_tokens, c.tokens))
        else:
            if not pending:
                if p.include_usage:
                    out += wire.usage_chunk(head, _usage(p, choices))
                out += DONE
        if not resp.prepared:
            await resp.prepare(request)
        if cut_after:
            parts = bytes(out).split(b"\n\n")[:-1]
            if events + len(parts) > cut_after:
                keep = parts[: cut_after - events]
                await _cut(request, resp, b"".join(e + b"\n\n" for e in keep), emu)
                return resp
            events += len(parts)
        await resp.write(bytes(out))
    await resp.write_eof()
    return resp


async def _cut(request: web.Request, resp: web.StreamResponse, data: bytes, emu: Emulator) -> None:
    """Simulate a worker dying mid-stream: send what was produced, then drop the socket."""
    await resp.write(data)
    if emu.cfg.faults.die_exits:
        await asyncio.sleep(0.01)
        log.error("die-mid-stream: exiting")
        os._exit(3)
    transport = request.transport
    if transport is not None:
        transport.close()
