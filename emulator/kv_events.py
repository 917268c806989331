"""The emulator's KV-cache events, published as vLLM publishes them (docs/WIRE_SPEC.md §8):
`--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557", "topic": "kv"}'`, vLLM's flag and JSON.

After every engine step the engine's events (emulator/engine.py `kv_events`: runs of
newly cached prompt blocks, evicted blocks) go out as one ZMQ PUB multipart message
`(topic, seq, payload)`: `seq` an 8-byte big-endian counter from 0, `payload` msgpack of
vLLM's `KVEventBatch` as msgspec encodes it (`array_like`, tagged):

    [ts, [["BlockStored", [h…], parent | None, [token ids…], block_size, None, "GPU"],
          ["BlockRemoved", [h…], "GPU"], …]]

Block hashes are the engine model's chained ints (emulator/prefix.py). Not emulated:
the replay socket (`replay_endpoint`), data-parallel ranks (refused), LoRA, media.
pyzmq and msgpack are optional (`pip install fleetgate[kv-events]`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    endpoint: str = "tcp://*:5557"  # vLLM's default: binds
    topic: str = ""


def parse_config(raw: str | None) -> KvEventsConfig | None:
    """vLLM's `--kv-events-config` JSON; None when events are off (ValueError if bad)."""
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"--kv-events-config: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError("--kv-events-config: a JSON object")
    if not doc.get("enable_kv_cache_events", False):
        return None
    publisher = doc.get("publisher", "zmq")
    if publisher == "null":
        return None
    if publisher != "zmq":
        raise ValueError(f"--kv-events-config: publisher {publisher!r} (only zmq, null)")
    endpoint = doc.get("endpoint", "tcp://*:5557")
    topic = doc.get("topic", "")
    if not isinstance(endpoint, str) or not isinstance(topic, str):
        raise ValueError("--kv-events-config: endpoint and topic are strings")
    return KvEventsConfig(endpoint, topic)


def binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard host, `ipc://` or `inproc://` binds; anything else connects."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def wire_events(events: list[tuple[Any, ...]], block_size: int) -> list[list[Any]]:
    """The engine's events as vLLM's tagged arrays."""
    out: list[list[Any]] = []
    for event in events:
        if event[0] == "stored":
            _, request, first, hashes = event
            start = first * block_size
            ids = list(request.token_ids[start : start + len(hashes) * block_size])
            parent = request.block_hashes[first - 1] if first else None
            out.append(["BlockStored", list(hashes), parent, ids, block_size, None, "GPU"])
        else:
            out.append(["BlockRemoved", list(event[1]), "GPU"])
    return out


class Publisher:
    """One engine's ZMQ PUB stream."""

    def __init__(self, config: KvEventsConfig, block_size: int) -> None:
        try:
            import msgpack
            import zmq
        except ImportError:
            raise ValueError(
                "--kv-events-config: needs pyzmq and msgpack (pip install fleetgate[kv-events])"
            ) from None
        self.block_size = block_size
        self._pack = msgpack.packb
        self.topic = config.topic.encode()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, 100_000)  # vLLM's hwm
        self._sock.setsockopt(zmq.LINGER, 0)
        if binds(config.endpoint):
            self._sock.bind(config.endpoint)
        else:
            self._sock.connect(config.endpoint)
        self._noblock = zmq.NOBLOCK
        self._again = zmq.Again
        self.seq = 0
        self.dropped = 0  # batches the socket would not take (no subscriber room)

    def publish(self, events: list[tuple[Any, ...]]) -> None:
        """Send the events as one batch (nothing when there are none), and clear them."""
        if not events:
            return
        payload = self._pack([time.time(), wire_events(events, self.block_size)])
        events.clear()
        try:
            self._sock.send_multipart(
                [self.topic, self.seq.to_bytes(8, "big"), payload], flags=self._noblock
            )
        except self._again:
            self.dropped += 1
        self.seq += 1  # a dropped batch is a gap the subscriber sees

    def close(self) -> None:
        self._sock.close(0)
