"""One side of a disaggregated prefill/decode pair (`--role prefill|decode`), speaking the
P/D protocol of the emulator's personality (docs/WIRE_SPEC.md §9).

vLLM (NIXL connector):
- prefill: a request whose `kv_transfer_params.do_remote_decode` is set runs as sent (the
  router asks for one token, not streamed); when it ends `length` its answer carries
  `kv_transfer_params` naming this server (`remote_engine_id`, `remote_host`,
  `remote_port`), the request (`remote_request_id`) and ⌈P / block size⌉ block ids, and
  the KV is kept for its decode for `kv_lease_s` or until read once (another ending — EOS
  at the first token, an abort — issues nothing, as vLLM's `request_finished`);
- decode: a request whose `kv_transfer_params.do_remote_prefill` is set reads the KV from
  the named prefill first (`POST /_fleetgate/kv/read`, standing in for NIXL's side
  channel), which answers only for parameters it issued, unexpired and unread; anything
  else fails the request as `kv_load_failure_policy="fail"` does (500 `Internal server
  error`; streamed: the error event). Parameters without the four remote fields are
  ignored (vLLM logs them and recomputes the prompt).
SGLang (PD mode):
- prefill: a request without `bootstrap_room` is refused (400); with one it runs as a
  one-token request whatever `max_tokens` says and, when it ends, publishes the room's
  blocks to its decode (`POST /_fleetgate/kv/room`, standing in for the bootstrap server
  and the transfer) for `kv_lease_s`; an aborted prefill fails the room;
- decode: waits for the room at `bootstrap_host:bootstrap_port` up to
  `waiting_timeout_s`; a failed or missing room fails the request (500).
Both decodes then wait `transfer_s_per_block` per block (the KV's transfer) and submit
the request with its prompt counted as computed (`EngineRequest.remote_tokens`: only the
last prompt token is computed again).

Deviations: the prefill's engine frees the request's blocks when it ends (a real prefill
holds them until they are read), and a decode holds no KV while it waits for the
transfer (a real one has allocated it); the KV carries no content (the decode's answer is
planned from its own request, as every emulated answer is).

Failure posture: every wait is bounded (the lease, the waiting timeout, the HTTP call's
timeout); a read that cannot complete is the decode's failure, never a hang; an entry is
read at most once.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import secrets
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from emulator.pd_config import PdConfig
from emulator.schema import ApiError
from emulator.state import EMU, Emulator

log = logging.getLogger("emulator.pd")

READ_PATH = "/_fleetgate/kv/read"
ROOM_PATH = "/_fleetgate/kv/room"
# vLLM's do_remote_prefill parameters must name all four, or the decode recomputes
_REMOTE = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")


class KvLoadFailed(Exception):
    """The decode could not get its prompt's KV (the request fails)."""


@dataclass(slots=True)
class _Issued:
    blocks: int
    expires: float  # engine seconds (the driver clock's wall_now)


@dataclass(eq=False)
class PdSide:
    """This server's side of its P/D pairs: what it issued (prefill) and how it reads (decode)."""

    cfg: PdConfig
    emu: Emulator
    issued: dict[str, _Issued] = field(default_factory=dict)  # vLLM prefill: by request id
    rooms: dict[int, asyncio.Future[int]] = field(default_factory=dict)  # SGLang prefill
    reads: int = 0  # KV handed to a decode
    refused: int = 0  # reads of parameters or rooms never issued, expired or failed
    # the last generation requests as a router sent them (GET /_fleetgate/pd/seen): what
    # a P/D router's conformance test compares with the protocol
    seen: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=64))
    _session: aiohttp.ClientSession | None = None

    @property
    def prefill(self) -> bool:
        return self.cfg.role == "prefill"

    def now(self) -> float:
        return self.emu.driver.clock.wall_now()

    def wall(self, engine_s: float) -> float:
        return engine_s * self.emu.cfg.time_scale

    def blocks(self, prompt_tokens: int) -> int:
        bs = self.emu.cfg.engine.block_size
        return -(-prompt_tokens // bs)

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    # -- vLLM prefill: KV kept for a decode --------------------------------------------
    def issue(self, prompt_tokens: int) -> dict[str, Any]:
        now = self.now()
        for rid in [r for r, e in self.issued.items() if e.expires <= now]:
            del self.issued[rid]  # the lease ran out: the blocks were freed
        rid = "cmpl-" + secrets.token_hex(8) + "-0"
        blocks = self.blocks(prompt_tokens)
        self.issued[rid] = _Issued(blocks, now + self.cfg.kv_lease_s)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(range(1, blocks + 1))],
            "remote_engine_id": self.cfg.engine_id,
            "remote_request_id": rid,
            "remote_host": self.emu.cfg.host,
            "remote_port": self.emu.cfg.port,
            "tp_size": 1,
        }

    def read(self, engine_id: object, request_id: object) -> int | None:
        """The blocks of a request this server issued, once; None for anything else."""
        if engine_id != self.cfg.engine_id or not isinstance(request_id, str):
            self.refused += 1
            return None
        entry = self.issued.pop(request_id, None)
        if entry is None or entry.expires <= self.now():
            self.refused += 1
            return None
        self.reads += 1
        return entry.blocks

    # -- SGLang prefill: a room per request --------------------------------------------
    def room(self, room: int) -> asyncio.Future[int]:
        fut = self.rooms.get(room)
        if fut is None:
            fut = self.rooms[room] = asyncio.get_running_loop().create_future()
        return fut

    def publish(self, room: int, blocks: int | None) -> None:
        """The prefill of `room` ended: its blocks for the decode (None: it failed)."""
        fut = self.room(room)
        if not fut.done():
            if blocks is None:
                fut.set_exception(KvLoadFailed(f"prefill of room {room} failed"))
                fut.exception()  # retrieved: a room nobody waits for logs nothing
            else:
                fut.set_result(blocks)
        loop = asyncio.get_running_loop()
        loop.call_later(self.wall(self.cfg.kv_lease_s), self._expire, room, fut)

    def _expire(self, room: int, fut: asyncio.Future[int]) -> None:
        if self.rooms.get(room) is fut:
            del self.rooms[room]

    async def wait_room(self, room: int) -> int | None:
        """A decode's read of `room`: its blocks once its prefill ended, read once; None
        when the prefill failed or did not come within the waiting timeout."""
        fut = self.room(room)
        try:
            async with asyncio.timeout(self.wall(self.cfg.waiting_timeout_s)):
                blocks = await asyncio.shield(fut)
        except (TimeoutError, KvLoadFailed):
            self.refused += 1
            return None
        finally:
            if fut.done() and self.rooms.get(room) is fut:
                del self.rooms[room]  # read (or failed) once
        self.reads += 1
        return blocks

    # -- decode: get the KV ------------------------------------------------------------
    async def fetch(self, url: str, payload: Mapping[str, Any], timeout_s: float) -> int:
        session = await self.session()
        try:
            async with session.post(
                url, json=dict(payload), timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                if resp.status != 200:
                    raise KvLoadFailed(f"{url}: {resp.status}")
                blocks = (await resp.json()).get("blocks")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise KvLoadFailed(f"{url}: {exc!r}") from None
        if not isinstance(blocks, int) or blocks < 0:
            raise KvLoadFailed(f"{url}: no block count")
        return blocks

    async def transfer(self, blocks: int) -> None:
        await asyncio.sleep(self.wall(blocks * self.cfg.transfer_s_per_block))


@dataclass(eq=False)
class Turn:
    """One generation request's part in a P/D pair, on this server."""

    side: PdSide
    receives: bool  # a decode: its prompt's KV comes from the prefill first
    url: str = ""  # decode: where to read it
    payload: dict[str, Any] = field(default_factory=dict)
    room: int | None = None  # SGLang
    issues: bool = False  # vLLM prefill: its answer carries kv_transfer_params

    async def receive(self) -> None:
        """Decode: read the KV (raises `KvLoadFailed`), then wait its transfer."""
        side = self.side
        timeout = side.wall(side.cfg.waiting_timeout_s) + 5.0
        blocks = await side.fetch(self.url, self.payload, timeout)
        await side.transfer(blocks)

    def answered(self, body: bytes, prompt_tokens: int, reason: str | None) -> bytes:
        """vLLM prefill: the answer's `kv_transfer_params`, when it ended `length`."""
        if not self.issues or reason != "length":
            return body
        doc = orjson.loads(body)
        doc["kv_transfer_params"] = self.side.issue(prompt_tokens)
        return orjson.dumps(doc)

    def ended(self, ok: bool, prompt_tokens: int) -> None:
        """SGLang prefill: the room's KV is ready for its decode (or the prefill failed)."""
        if self.room is not None and not self.receives:
            self.side.publish(self.room, self.side.blocks(prompt_tokens) if ok else None)


PD: web.AppKey[PdSide] = web.AppKey("pd", PdSide)


def turn_for(request: web.Request, body: object) -> Turn | None:
    """This request's P/D part, or None (no role, or a request that is not a P/D one).
    SGLang's prefill is made a one-token request here (it prefills, samples one, ends)."""
    side = request.app.get(PD)
    if side is None or not isinstance(body, dict):
        return None
    side.seen.append(
        {
            "path": request.path,
            "x-request-id": request.headers.get("X-Request-Id"),
            "body": copy.deepcopy(body),
        }
    )
    if side.emu.vllm:
        return _vllm_turn(side, body)
    return _sglang_turn(side, body)


def _vllm_turn(side: PdSide, body: dict[str, Any]) -> Turn | None:
    params = body.get("kv_transfer_params")
    if not isinstance(params, dict):
        return None
    if side.prefill:
        return Turn(side, False, issues=bool(params.get("do_remote_decode")))
    if not params.get("do_remote_prefill"):
        return None
    if not params.get("remote_block_ids") or not all(k in params for k in _REMOTE):
        log.warning(
            "Got invalid KVTransferParams: %s. This request will not utilize KVTransfer", params
        )
        return None
    host = params["remote_host"]
    url = f"http://{f'[{host}]' if ':' in str(host) else host}:{params['remote_port']}{READ_PATH}"
    payload = {"engine_id": params["remote_engine_id"], "request_id": params["remote_request_id"]}
    return Turn(side, True, url, payload)


def _sglang_turn(side: PdSide, body: dict[str, Any]) -> Turn:
    room = body.get("bootstrap_room")
    if not isinstance(room, int) or isinstance(room, bool):
        raise ApiError(400, "bootstrap_room should not be None", "BadRequestError")
    if side.prefill:
        body["max_tokens"] = 1  # the prefill samples one token and hands the rest over
        body.pop("max_completion_tokens", None)
        return Turn(side, False, room=room)
    host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
    if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
        raise ApiError(400, "bootstrap_host and bootstrap_port are required", "BadRequestError")
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}{ROOM_PATH}"
    return Turn(side, True, url, {"room": room}, room=room)


def kv_load_error(emu: Emulator, turn: Turn) -> ApiError:
    """What a decode answers when its KV never came (WIRE_SPEC §9)."""
    if emu.vllm:
        return ApiError(500, "Internal server error", "InternalServerError")
    return ApiError(
        500,
        f"KV transfer failed for bootstrap_room={turn.room}: the prefill's KV never arrived",
        "InternalServerError",
    )


# -- the prefill side's endpoints (NIXL's side channel / SGLang's bootstrap server) ------


async def _read(request: web.Request) -> web.Response:
    side = request.app[PD]
    body = await request.json()
    blocks = side.read(body.get("engine_id"), body.get("request_id"))
    if blocks is None:
        return web.json_response({"error": "unknown, expired or already read"}, status=404)
    return web.json_response({"blocks": blocks})


async def _room(request: web.Request) -> web.Response:
    side = request.app[PD]
    body = await request.json()
    room = body.get("room")
    if not isinstance(room, int):
        return web.json_response({"error": "room must be an integer"}, status=400)
    blocks = await side.wait_room(room)
    if blocks is None:
        return web.json_response({"error": "the room's prefill failed or never came"}, status=404)
    return web.json_response({"blocks": blocks})


async def _seen(request: web.Request) -> web.Response:
    return web.json_response(list(request.app[PD].seen))


def add_pd(app: web.Application) -> None:
    """Give the app its P/D side (the server's one hook): the prefill's endpoints, the
    decode's HTTP session closed with the app."""
    emu = app[EMU]
    assert emu.cfg.pd is not None
    side = PdSide(emu.cfg.pd, emu)
    app[PD] = side
    app.router.add_get("/_fleetgate/pd/seen", _seen, allow_head=False)
    if side.prefill:
        app.router.add_post(READ_PATH if emu.vllm else ROOM_PATH, _read if emu.vllm else _room)

    async def _close(app: web.Application) -> None:
        await side.close()

    app.on_cleanup.append(_close)
