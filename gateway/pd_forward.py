"""Carrying out the core's `SendPair` for a `kind: pd` pool: the two upstream calls of
the pool's protocol (docs/WIRE_SPEC.md §9), the hand-off reported to the core, the
decode's answer relayed to the client as any answer is (gateway/forward.py).

    vllm    the prefill call — the body with `kv_transfer_params: {do_remote_decode:
            true, …}`, `stream: false`, `max_tokens: 1` (and `max_completion_tokens: 1`
            when given), no `stream_options` — answered whole; its `kv_transfer_params`
            go into the decode call's body (the body as forwarded otherwise), sent when
            the core answers `HANDED_OFF` with `SendDecode`
    sglang  one body — the forwarded one with `bootstrap_host` (the prefill's host),
            `bootstrap_port` (its bootstrap port, else its URL's port), `bootstrap_room`
            (63 random bits) — sent to the prefill and the decode at once; the prefill's
            answer (read whole, discarded) is the hand-off; the decode's is relayed

Every decision is the core's: a failed call is reported with its side (`UpstreamFailed.
side`), and the core answers another `SendPair` (the whole pair again, before any byte
reached the client) or `Fail`. The prefill's outcome is known before any decode byte is
relayed (SGLang's decode cannot answer before its KV came; its answer waits for the
prefill's), so a failed prefill is never spliced into an answer. A prefill's own 4xx
(e.g. a context refusal) goes to the client as the engine's 4xx; a 5xx that is not
retried, too. A client that leaves cancels this task: both calls are cancelled with it
(their connections closed), and the settle step releases both slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import Any, Protocol

import orjson

from gateway.attempt import Attempt
from gateway.errors import BadGateway, GatewayError
from gateway.metrics import GatewayMetrics
from gateway.openai_request import ParsedRequest
from gateway.pd_metrics import PdMetrics
from gateway.responder import Responder
from gateway.upstream import UpstreamClient, UpstreamResponse
from gateway.upstream_errors import UpstreamError
from gateway.workers import WorkerState
from policies.actions import PROCEED, Action, Fail, SendDecode, SendPair
from policies.core import Core
from policies.events import HANDED_OFF, UpstreamFailed


class ClientSide(Protocol):
    slow: bool

    def client_blocked(self) -> bool: ...

    def cut(self) -> None: ...


class Forwarder(Protocol):
    """What a pair's calls share with a single call (gateway/forward.py's `Forwarder`):
    the client, the core, the metrics, and how an answer is relayed and an error mapped."""

    core: Core
    client: UpstreamClient
    metrics: GatewayMetrics
    loop: asyncio.AbstractEventLoop

    def _map(self, exc: UpstreamError) -> GatewayError: ...

    async def _relay_stream(
        self,
        up: UpstreamResponse,
        responder: Responder,
        att: Attempt,
        worker: WorkerState,
        rid: str,
        strip_usage: bool,
        source: ClientSide,
    ) -> None: ...

    async def _read_whole(
        self, up: UpstreamResponse, att: Attempt, worker: WorkerState
    ) -> bytes: ...

    async def _send_whole(
        self,
        up: UpstreamResponse,
        body: bytes,
        responder: Responder,
        att: Attempt,
        worker: WorkerState,
        rid: str,
    ) -> None: ...


# what vLLM's disaggregated-serving proxy asks a prefill for (toy_proxy_server.py)
_REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class _Whole:
    """A call answered whole: its status and body (its connection given back)."""

    __slots__ = ("body", "status", "up")

    def __init__(self, up: UpstreamResponse, body: bytes) -> None:
        self.up, self.status, self.body = up, up.status, body


class PairForwarder:
    def __init__(self, fwd: Forwarder, metrics: PdMetrics) -> None:
        self.fwd = fwd
        self.metrics = metrics

    async def run(
        self,
        action: SendPair,
        parsed: ParsedRequest,
        body: bytes,
        strip_usage: bool,
        path: bytes,
        headers: bytes,
        responder: Responder,
        att: Attempt,
        rid: str,
        source: ClientSide,
    ) -> None:
        """Carry out `action` and what the core answers until the client has its answer."""
        doc: dict[str, Any] = orjson.loads(body)
        step: Action = action
        last: UpstreamError | _Whole | None = None
        while isinstance(step, SendPair):
            att.pool, att.worker = step.pool, step.decode
            if step.attempt:
                self.fwd.metrics.retries.labels(step.pool).inc()
            run = self._vllm if step.protocol == "vllm" else self._sglang
            outcome = await run(
                step, parsed, doc, strip_usage, path, headers, responder, att, rid, source
            )
            if outcome is None:
                return  # answered
            step, last = outcome
        assert isinstance(step, Fail), step
        if isinstance(last, _Whole):  # the engine's own error answer goes to the client
            await self._relay_error(last, responder, att, rid)
            return
        if last is not None:
            raise self.fwd._map(last)
        raise BadGateway("upstream failed")

    # --- vLLM: prefill, then decode with its kv_transfer_params ------------------------
    async def _vllm(
        self,
        send: SendPair,
        parsed: ParsedRequest,
        doc: dict[str, Any],
        strip_usage: bool,
        path: bytes,
        headers: bytes,
        responder: Responder,
        att: Attempt,
        rid: str,
        source: ClientSide,
    ) -> tuple[Action, UpstreamError | _Whole] | None:
        fwd = self.fwd
        loop = fwd.loop
        ticket = send.ticket
        prefill: WorkerState = send.prefill_load  # type: ignore[assignment]
        decode: WorkerState = send.decode_load  # type: ignore[assignment]
        first = dict(doc)
        first["kv_transfer_params"] = dict(_REMOTE_DECODE)
        first["stream"] = False
        first["max_tokens"] = 1
        if "max_completion_tokens" in first:
            first["max_completion_tokens"] = 1
        first.pop("stream_options", None)
        sent = loop.time()
        got = await self._whole(prefill, path, headers, orjson.dumps(first))
        if not isinstance(got, _Whole) or got.status != 200:
            if isinstance(got, _Whole) and got.status < 500:
                await self._relay_error(got, responder, att, rid)  # the engine's 4xx
                return None
            return self._failed(send, "prefill", got), got
        params = _params(got.body)
        self.metrics.prefill_seconds.labels(send.pool).observe(loop.time() - sent)
        step = fwd.core.on(ticket, HANDED_OFF, loop.time())
        if not isinstance(step, SendDecode):
            return None  # settled meanwhile (the client left): nothing to send
        handoff = loop.time()
        second = dict(doc)
        if params is not None:
            second["kv_transfer_params"] = params
        try:
            up = await fwd.client.request(
                decode.endpoint, b"POST", path, headers + decode.extra_headers, orjson.dumps(second)
            )
        except UpstreamError as exc:
            return self._failed(send, "decode", exc), exc
        await self._relay(up, parsed, strip_usage, responder, att, decode, rid, source, handoff)
        return None

    # --- SGLang: both at once, one bootstrap room -------------------------------------
    async def _sglang(
        self,
        send: SendPair,
        parsed: ParsedRequest,
        doc: dict[str, Any],
        strip_usage: bool,
        path: bytes,
        headers: bytes,
        responder: Responder,
        att: Attempt,
        rid: str,
        source: ClientSide,
    ) -> tuple[Action, UpstreamError | _Whole] | None:
        fwd = self.fwd
        loop = fwd.loop
        ticket = send.ticket
        prefill: WorkerState = send.prefill_load  # type: ignore[assignment]
        decode: WorkerState = send.decode_load  # type: ignore[assignment]
        both = dict(doc)
        both["bootstrap_host"] = prefill.endpoint.host
        both["bootstrap_port"] = prefill.bootstrap_port or prefill.endpoint.port
        both["bootstrap_room"] = secrets.randbits(63)
        data = orjson.dumps(both)
        sent = loop.time()
        p_task = asyncio.ensure_future(self._whole(prefill, path, headers, data))
        d_task = asyncio.ensure_future(
            fwd.client.request(decode.endpoint, b"POST", path, headers + decode.extra_headers, data)
        )
        try:
            # the prefill's outcome first: the decode cannot answer before its KV came
            got = await p_task
            if not isinstance(got, _Whole) or got.status != 200:
                await _drop(d_task)
                if isinstance(got, _Whole) and got.status < 500:
                    await self._relay_error(got, responder, att, rid)
                    return None
                return self._failed(send, "prefill", got), got
            self.metrics.prefill_seconds.labels(send.pool).observe(loop.time() - sent)
            if fwd.core.on(ticket, HANDED_OFF, loop.time()) is not PROCEED:
                await _drop(d_task)
                return None
            handoff = loop.time()
            try:
                up = await d_task
            except UpstreamError as exc:
                return self._failed(send, "decode", exc), exc
        finally:
            for task in (p_task, d_task):
                if not task.done():
                    await _drop(task)
        await self._relay(up, parsed, strip_usage, responder, att, decode, rid, source, handoff)
        return None

    # --- shared ---------------------------------------------------------------------
    async def _whole(
        self, worker: WorkerState, path: bytes, headers: bytes, body: bytes
    ) -> _Whole | UpstreamError:
        """One call answered whole, or its failure (never raised: the caller reports it)."""
        try:
            up = await self.fwd.client.request(
                worker.endpoint, b"POST", path, headers + worker.extra_headers, body
            )
        except UpstreamError as exc:
            return exc
        try:
            return _Whole(up, await up.read())
        except UpstreamError as exc:
            return exc
        finally:
            up.release()

    def _failed(self, send: SendPair, side: str, got: UpstreamError | _Whole) -> Action:
        """Tell the core one call of the pair failed before the client saw a byte."""
        fwd = self.fwd
        worker: WorkerState = send.prefill_load if side == "prefill" else send.decode_load  # type: ignore[assignment]
        att: Attempt = send.ticket.token  # type: ignore[assignment]
        if isinstance(got, _Whole):
            kind = f"http_{got.status}"
            event = UpstreamFailed(kind, False, True, True, side)
        else:
            kind = got.kind
            event = UpstreamFailed(kind, got.retryable, got.blames_worker, True, side)
        att.error = f"{side}_{kind}"
        fwd.metrics.upstream_errors.labels(worker.pool, worker.id, kind).inc()
        self.metrics.handoffs.labels(send.pool, f"{side}_failed").inc()
        return fwd.core.on(send.ticket, event, fwd.loop.time())

    async def _relay(
        self,
        up: UpstreamResponse,
        parsed: ParsedRequest,
        strip_usage: bool,
        responder: Responder,
        att: Attempt,
        decode: WorkerState,
        rid: str,
        source: ClientSide,
        handoff: float,
    ) -> None:
        """The decode's answer, relayed as any answer (a failure after the first byte is
        the stream's error event; the core hears it through the forwarder, side decode)."""
        fwd = self.fwd
        self.metrics.handoffs.labels(att.pool, "ok").inc()
        try:
            if parsed.stream and up.status == 200:
                await fwd._relay_stream(up, responder, att, decode, rid, strip_usage, source)
            else:
                answer = await fwd._read_whole(up, att, decode)
                await fwd._send_whole(up, answer, responder, att, decode, rid)
        finally:
            up.release()
        if att.ttft is not None:
            first = att.t0 + att.ttft
            if first >= handoff:
                self.metrics.transfer_seconds.labels(att.pool).observe(first - handoff)

    async def _relay_error(self, got: _Whole, responder: Responder, att: Attempt, rid: str) -> None:
        """A call's own error answer (an engine 4xx, or a 5xx not retried), to the client."""
        att.status = got.status
        headers = [
            (b"content-type", got.up.header(b"content-type") or b"application/json"),
            (b"x-request-id", rid.encode()),
            (b"x-fleetgate-pool", att.pool.encode()),
            *att.extra_headers,
        ]
        await responder.send(got.status, headers, got.body)


def _params(body: bytes) -> dict[str, Any] | None:
    """The prefill answer's `kv_transfer_params` (None: it issued none, e.g. it ended on
    EOS: the decode then computes the prompt itself, as vLLM's does)."""
    try:
        params = orjson.loads(body).get("kv_transfer_params")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return params if isinstance(params, dict) else None


async def _drop(task: asyncio.Future[Any]) -> None:
    """Cancel a call nobody will read (its connection is closed); give back a response
    that came anyway."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, UpstreamError):
        got = await task
        if isinstance(got, UpstreamResponse):
            got.release()
