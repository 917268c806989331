"""API keys → entitlements, kept only as keyed hashes.

A key is never stored: the gateway keeps HMAC-SHA256(server secret, key) — `auth.key_secret`,
the same on every replica — so a leaked configuration, Redis dump or admin listing does not
leak usable keys, and without the secret a hash cannot even be tested offline. A request's
key is hashed once and looked up; the match is confirmed with `hmac.compare_digest` (the
lookup itself is on the digest of a secret-keyed MAC, which a client cannot steer, so its
timing tells nothing about stored keys).

Configuration accepts either form: the key itself, or its hash `hmac-sha256:<64 hex>`
(`key_hash` prints it), so a file need not hold plain keys.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

HASH_PREFIX = "hmac-sha256:"
_BLOCK = 64  # SHA-256's block size in bytes
_IPAD = bytes(b ^ 0x36 for b in range(256))  # RFC 2104's pads, as translate tables
_OPAD = bytes(b ^ 0x5C for b in range(256))


def key_hash(secret: str, key: str) -> str:
    """The stored form of `key`: `hmac-sha256:<hex>` keyed by the server secret."""
    digest = hmac.new(secret.encode(), key.encode(), hashlib.sha256).hexdigest()
    return HASH_PREFIX + digest


def stored_form(secret: str, key_or_hash: str) -> str:
    """A configured key in its stored form (a hash given as such is kept)."""
    if key_or_hash.startswith(HASH_PREFIX):
        hexpart = key_or_hash[len(HASH_PREFIX) :]
        if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
            raise ValueError(f"{HASH_PREFIX}… must be 64 lowercase hex digits")
        return key_or_hash
    return key_hash(secret, key_or_hash)


_BUCKET = len(HASH_PREFIX) + 16  # the lookup is on a digest's first 64 bits


@dataclass(frozen=True, slots=True)
class KeyedHash:
    """`key_hash` under one secret, with the secret's padded-key SHA-256 states computed
    once (RFC 2104: H((K ⊕ opad) ‖ H((K ⊕ ipad) ‖ m))): per request two state copies,
    about a third of `hmac.new`'s cost, which redoes the key schedule every call."""

    inner: Any  # hashlib's sha256 object, after K ⊕ ipad
    outer: Any  # after K ⊕ opad

    @classmethod
    def of(cls, secret: str) -> KeyedHash:
        k = secret.encode()
        if len(k) > _BLOCK:
            k = hashlib.sha256(k).digest()
        k = k.ljust(_BLOCK, b"\0")
        return cls(hashlib.sha256(k.translate(_IPAD)), hashlib.sha256(k.translate(_OPAD)))

    def __call__(self, key: str) -> str:
        inner = self.inner.copy()
        inner.update(key.encode())
        outer = self.outer.copy()
        outer.update(inner.digest())
        digest: str = outer.hexdigest()
        return HASH_PREFIX + digest


@dataclass(slots=True)
class KeyDirectory:
    """Key hash → entitlement name, from the configuration and the admin API.

    Looked up by the first 64 bits of the digest; the whole digest is then compared with
    `hmac.compare_digest` against each stored hash in that bucket."""

    secret: str
    configured: dict[str, str] = field(default_factory=dict)  # hash → name, from the file
    managed: dict[str, str] = field(default_factory=dict)  # hash → name, the admin API's
    _buckets: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    _hash: KeyedHash = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._hash = KeyedHash.of(self.secret)

    @classmethod
    def build(cls, secret: str | None, keys: Mapping[str, Iterable[str]]) -> KeyDirectory:
        d = cls(secret or "")
        for name, given in keys.items():
            for k in given:
                d.configured[stored_form(d.secret, k)] = name
        d._index()
        return d

    def entitlement_of(self, key: str) -> str | None:
        """The entitlement `key` belongs to; None for an unknown key."""
        if not self.secret:
            return None
        digest = self._hash(key)
        found = None
        for stored, name in self._buckets.get(digest[:_BUCKET], ()):
            if hmac.compare_digest(stored, digest):
                found = name
        return found

    def set_managed(self, name: str, hashes: Iterable[str]) -> None:
        """The admin API's keys of entitlement `name` (replacing its previous ones)."""
        for h in [h for h, n in self.managed.items() if n == name]:
            del self.managed[h]
        for h in hashes:
            self.managed[h] = name
        self._index()

    def owner_elsewhere(self, name: str, hashes: Iterable[str]) -> str | None:
        """The entitlement other than `name` that one of `hashes` already names (configured
        or made through the admin API), None when they are all free or `name`'s own."""
        for h in hashes:
            owner = self.configured.get(h) or self.managed.get(h)
            if owner is not None and owner != name:
                return owner
        return None

    def count(self, name: str) -> int:
        return sum(n == name for n in self.configured.values()) + sum(
            n == name for n in self.managed.values()
        )

    def _index(self) -> None:
        buckets: dict[str, list[tuple[str, str]]] = {}
        for h, n in (self.configured | self.managed).items():
            buckets.setdefault(h[:_BUCKET], []).append((h, n))
        self._buckets = buckets
