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
(an event it missed) cannot be placed in a chain and is skipped (`unplaced`).

Aging, when events are lost (a batch the PUB socket dropped that the sequence check did
not catch, an engine restarted without AllBlocksCleared whose first batches never came):
- the index's entries from BlockStored are the index's like any other: they expire
  `ttl_s` after they were last stored or dispatched there, and count against its bound, so
  a block whose BlockRemoved was lost stops matching one TTL after the gateway last sent
  or heard of it (a block still in use is refreshed by every dispatch that covers it);
- the engine → own maps age the same way: an entry goes `ttl_s` after the block was
  stored or last extended (a parent of a later BlockStored), and all workers' maps
  together hold at most `max_blocks` entries, least recently used first (the index's
  bound by default: the two structures stay within twice the index's entries). A parent
  aged out of the map makes its later children unplaced; the gateway's own dispatch
  records still put them in the index.

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
    max_blocks: int = 262_144  # engine → own hashes kept over all workers, at most
    stored: int = 0  # blocks recorded from BlockStored
    removed: int = 0  # blocks dropped by BlockRemoved
    cleared: int = 0  # AllBlocksCleared events (and gaps: `reset`)
    unplaced: int = 0  # stored blocks whose parent was unknown
    # per worker: engine hash → (own hash, when stored or last extended), least recent first
    _own: dict[str, OrderedDict[EngineHash, tuple[int, float]]] = field(default_factory=dict)
    _own_size: int = 0

    def __post_init__(self) -> None:
        if self.max_blocks < 1:
            raise ValueError("max_blocks: must be >= 1")

    def mapped(self, worker: str | None = None) -> int:
        """Engine → own entries held (for `worker`, or over all workers)."""
        if worker is None:
            return self._own_size
        own = self._own.get(worker)
        return 0 if own is None else len(own)

    def apply(self, worker: str, events: Sequence[Any], now: float) -> None:
        """One batch's events of `worker`'s engine, in order. Malformed events raise
        ValueError (the caller drops the batch and resynchronises)."""
        self._expire(worker, now)
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
        own = self._own.pop(worker, None)
        if own is not None:
            self._own_size -= len(own)
        self.index.forget(worker)

    def _expire(self, worker: str, now: float) -> None:
        """Drop `worker`'s map entries not stored or extended within the index's TTL."""
        own = self._own.get(worker)
        if not own:
            return
        oldest = now - self.index.ttl_s
        gone = 0
        while own:
            _, (_, t) = next(iter(own.items()))
            if t >= oldest:
                break
            own.popitem(last=False)
            gone += 1
        self._own_size -= gone

    def _shrink(self) -> None:
        """The least recently used entries over all workers go until the bound holds."""
        while self._own_size > self.max_blocks:
            worker = min(
                (w for w, own in self._own.items() if own),
                key=lambda w: next(iter(self._own[w].values()))[1],
            )
            own = self._own[worker]
            until = min(
                (next(iter(o.values()))[1] for w, o in self._own.items() if o and w != worker),
                default=float("inf"),
            )
            while self._own_size > self.max_blocks and own:
                if next(iter(own.values()))[1] > until:
                    break
                own.popitem(last=False)
                self._own_size -= 1

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
            found = own.get(parent)
            if found is None:
                self.unplaced += len(hashes)
                return
            own_parent = found[0]
            own[parent] = (own_parent, now)  # extended: the engine still holds it
            own.move_to_end(parent)
        chain = token_block_hashes(token_ids, block_size, own_parent)
        if len(chain) != len(hashes):
            raise ValueError("BlockStored: token_ids do not fill its blocks")
        size = self._own_size
        for engine_hash, mine in zip(hashes, chain, strict=True):
            if engine_hash in own:
                own.move_to_end(engine_hash)
            else:
                size += 1
            own[engine_hash] = (mine, now)
        self._own_size = size
        if size > self.max_blocks:
            self._shrink()
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
        mine = [m[0] for h in event[1] if (m := own.pop(h, None)) is not None]
        self._own_size -= len(mine)
        self.removed += self.index.remove(worker, mine)
