"""An engine's KV-cache events applied to the prefix index (docs/WIRE_SPEC.md §8): what
keeps a cache-aware router's index equal to what the engines really hold, where an engine
publishes its events (vLLM's `--kv-events-config`, fleetgate's emulator the same).

Events arrive decoded from msgpack as vLLM's msgspec structs encode them (`array_like`,
tagged): a list whose first item is the type, then the fields in declaration order
(trailing fields at their default may be missing):

    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, ...]
    ["BlockRemoved", block_hashes, ...]
    ["AllBlocksCleared"]

An engine's block hashes cannot be recomputed in general (vLLM seeds its chain with random
bytes per process unless PYTHONHASHSEED is set, and the hash function is configurable), so
`KvEventApplier` re-hashes every stored block from its `token_ids` with the index's own
chain (`token_block_hashes`, extended from the parent's own hash) and keeps, per worker, a
map engine hash → own hash to apply removals. A stored block whose parent it does not know
(an event it missed) cannot be placed in a chain and is skipped (`unplaced`). The maps are
bounded like the index (`max_blocks` per worker, oldest first).

Pure: no I/O; the caller gives `now`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.prefix_index import PrefixIndex, token_block_hashes

EngineHash = int | bytes


@dataclass(slots=True)
class KvEventApplier:
    index: PrefixIndex
    max_blocks: int = 262_144  # engine → own hashes kept per worker, at most
    stored: int = 0  # blocks recorded from BlockStored
    removed: int = 0  # blocks dropped by BlockRemoved
    cleared: int = 0  # AllBlocksCleared events (and gaps: `reset`)
    unplaced: int = 0  # stored blocks whose parent was unknown
    _own: dict[str, OrderedDict[EngineHash, int]] = field(default_factory=dict)

    def apply(self, worker: str, events: Sequence[Any], now: float) -> None:
        """One batch's events of `worker`'s engine, in order. Malformed events raise
        ValueError (the caller drops the batch and resynchronises)."""
        for event in events:
            if not isinstance(event, (list, tuple)) or not event:
                raise ValueError("a KV event is a non-empty array")
            kind = event[0]
            if kind == "BlockStored":
                self._stored(worker, event, now)
            elif kind == "BlockRemoved":
                self._removed(worker, event)
            elif kind == "AllBlocksCleared":
                self.reset(worker)
            else:
                raise ValueError(f"unknown KV event {kind!r}")

    def reset(self, worker: str) -> None:
        """Forget `worker`'s blocks: its cache was cleared, or events were lost."""
        self.cleared += 1
        self._own.pop(worker, None)
        self.index.forget(worker)

    def _stored(self, worker: str, event: Sequence[Any], now: float) -> None:
        if len(event) < 5:
            raise ValueError("BlockStored: needs block_hashes, parent, token_ids, block_size")
        hashes, parent, token_ids, block_size = event[1], event[2], event[3], event[4]
        if not isinstance(hashes, list) or not isinstance(token_ids, list):
            raise ValueError("BlockStored: block_hashes and token_ids are arrays")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError("BlockStored: block_size must be a positive integer")
        if block_size != self.index.block_tokens:
            raise ValueError(
                f"BlockStored: block_size {block_size}, the index's {self.index.block_tokens}"
            )
        own = self._own.get(worker)
        if own is None:
            own = self._own[worker] = OrderedDict()
        own_parent: int | None = None
        if parent is not None:
            own_parent = own.get(parent)
            if own_parent is None:
                self.unplaced += len(hashes)
                return
        chain = token_block_hashes(token_ids, block_size, own_parent)
        if len(chain) != len(hashes):
            raise ValueError("BlockStored: token_ids do not fill its blocks")
        for engine_hash, mine in zip(hashes, chain, strict=True):
            own[engine_hash] = mine
            own.move_to_end(engine_hash)
        while len(own) > self.max_blocks:
            own.popitem(last=False)
        # a chain arrives piecewise (its parent's blocks were recorded earlier, and may
        # have aged out since): the index scans for the prefix instead of bisecting
        self.index.scan = True
        self.index.record(worker, chain, now)
        self.stored += len(hashes)

    def _removed(self, worker: str, event: Sequence[Any]) -> None:
        if len(event) < 2 or not isinstance(event[1], list):
            raise ValueError("BlockRemoved: needs block_hashes")
        own = self._own.get(worker)
        if own is None:
            return
        mine = [m for h in event[1] if (m := own.pop(h, None)) is not None]
        self.removed += self.index.remove(worker, mine)
