"""Per-client service counters, exponentially decayed in time (QUARTZ §4.3 of
../shared/seeds/003; VTC, Sheng et al. 2024).

    u(c, t) = Σ_i tokens_i · 2^(−(t − t_i) / half_life_s) / unit_tokens

over the client's requests i that had their first token at t_i (`served`): a client's
recent service in units of `unit_tokens`, forgetting old service so a long-active client
is not starved forever by an ever-growing counter. Bounded: a client served at most R
tokens per second has u ≤ R · half_life_s / (ln 2 · unit_tokens) + one request's tokens.

State is kept for active clients only: a client whose counter has decayed below
`forget_below` and who was not served for `idle_s` is dropped (swept every `sweep_every`
updates), and at most `max_clients` are held (the least recently served go first) — a
hard bound whatever the number of distinct clients.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(slots=True)
class ClientCounters:
    half_life_s: float = 10.0
    unit_tokens: float = 1000.0
    idle_s: float = 60.0
    max_clients: int = 10_000
    forget_below: float = 0.01
    sweep_every: int = 256
    _u: OrderedDict[str, tuple[float, float]] = field(default_factory=OrderedDict)  # (u, t)
    _updates: int = 0

    def __post_init__(self) -> None:
        if self.half_life_s <= 0 or self.unit_tokens <= 0 or self.idle_s < 0:
            raise ValueError("counters: half_life_s and unit_tokens must be positive")
        if self.max_clients < 1:
            raise ValueError("counters: max_clients must be >= 1")

    def value(self, client: str, now: float) -> float:
        held = self._u.get(client)
        if held is None:
            return 0.0
        u, t = held
        return u * 2.0 ** (-(now - t) / self.half_life_s) if now > t else u

    def add(self, client: str, tokens: float, now: float) -> None:
        held = self._u.get(client)
        u = self.value(client, now) + tokens / self.unit_tokens
        self._u[client] = (u, now if held is None else max(now, held[1]))
        self._u.move_to_end(client)
        while len(self._u) > self.max_clients:
            self._u.popitem(last=False)
        self._updates += 1
        if self._updates % self.sweep_every == 0:
            self.sweep(now)

    def sweep(self, now: float) -> None:
        """Drop idle clients whose service has decayed away (oldest served first)."""
        for client, (_, t) in list(self._u.items()):
            if now - t < self.idle_s:
                break  # the rest were served more recently
            if self.value(client, now) < self.forget_below:
                del self._u[client]

    def __len__(self) -> int:
        return len(self._u)
