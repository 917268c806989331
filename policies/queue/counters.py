"""Per-client service counters, exponentially decayed in time (QUARTZ §4.3 of
the QUARTZ paper; VTC, Sheng et al. 2024).

    S(c, t) = Σ_i tokens_i · 2^(−(t − t_i) / half_life_s)

over the client's requests i that had their first token at t_i (`add`): a client's recent
service, forgetting old service so a long-active client is not starved forever by an
ever-growing counter. Two readings:

- `value(c, t)` = S(c, t) / unit_tokens, the decayed service itself (TokenFair orders by it);
- `share(c, t)` = S(c, t) / mean over held clients of S(·, t): dimensionless, 1 for a client
  served as much as the average, 0 for one not served lately, at most the number of
  clients held. QUARTZ's key adds β · share (Eq. 8): with β = 0.10 a client served three
  times the average waits as if it had arrived (3 − 1) · 0.1 / λ = 10 s later at λ = 0.02.
  A raw token count in that place would weigh seconds against thousands of tokens and let
  β swamp the size and aging terms (a heavy client would starve).

All counters decay at the same rate, so they are kept scaled to a common reference time:
w(c) = S(c, t) · 2^((t − t_ref)/half_life_s), and share(c) = w(c) · n / Σ w — no power per
reading; t_ref moves forward (rescaling every w) before the scale could overflow.

State is kept for active clients only: a client whose counter has decayed below
`forget_below` (in units) and who was not served for `idle_s` is dropped (swept every
`sweep_every` updates), and at most `max_clients` are held (the least recently served go
first) — a hard bound whatever the number of distinct clients.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

_RESCALE_AT = 256.0  # half-lives between reference times (2^256 stays far from overflow)


@dataclass(slots=True)
class ClientCounters:
    half_life_s: float = 10.0
    unit_tokens: float = 1000.0
    idle_s: float = 60.0
    max_clients: int = 10_000
    forget_below: float = 0.01
    sweep_every: int = 256
    _w: OrderedDict[str, tuple[float, float]] = field(default_factory=OrderedDict)  # (w, t)
    _total: float = 0.0  # Σ w
    _ref: float | None = None  # the reference time of the scale
    _updates: int = 0

    def __post_init__(self) -> None:
        if self.half_life_s <= 0 or self.unit_tokens <= 0 or self.idle_s < 0:
            raise ValueError("counters: half_life_s and unit_tokens must be positive")
        if self.max_clients < 1:
            raise ValueError("counters: max_clients must be >= 1")

    def _decay(self, now: float) -> float:
        """2^(−(now − t_ref)/half_life): scaled w → S at `now`."""
        if self._ref is None:
            return 1.0
        return float(2.0 ** (-(now - self._ref) / self.half_life_s))

    def value(self, client: str, now: float) -> float:
        held = self._w.get(client)
        if held is None:
            return 0.0
        return held[0] * self._decay(now) / self.unit_tokens

    def share(self, client: str, now: float) -> float:
        held = self._w.get(client)
        if held is None or self._total <= 0.0:
            return 0.0
        return held[0] * len(self._w) / self._total

    def add(self, client: str, tokens: float, now: float) -> None:
        if self._ref is None:
            self._ref = now
        elif (now - self._ref) / self.half_life_s > _RESCALE_AT:
            self._rescale(now)
        w = tokens / self._decay(now)  # tokens at `now`, on the common scale
        held = self._w.get(client)
        if held is not None:
            w += held[0]
            self._total -= held[0]
        self._w[client] = (w, now if held is None else max(now, held[1]))
        self._total += w
        self._w.move_to_end(client)
        while len(self._w) > self.max_clients:
            _, (gone, _) = self._w.popitem(last=False)
            self._total -= gone
        self._updates += 1
        if self._updates % self.sweep_every == 0:
            self.sweep(now)

    def _rescale(self, now: float) -> None:
        k = self._decay(now)
        self._w = OrderedDict((c, (w * k, t)) for c, (w, t) in self._w.items())
        self._total = sum(w for w, _ in self._w.values())
        self._ref = now

    def sweep(self, now: float) -> None:
        """Drop idle clients whose service has decayed away (oldest served first)."""
        for client, (w, t) in list(self._w.items()):
            if now - t < self.idle_s:
                break  # the rest were served more recently
            if self.value(client, now) < self.forget_below:
                del self._w[client]
                self._total -= w
        if not self._w:
            self._total = 0.0

    def __len__(self) -> int:
        return len(self._w)
