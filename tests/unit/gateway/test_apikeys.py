"""The API-key hash: the precomputed HMAC the hot path uses equals HMAC-SHA256 itself."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from gateway.apikeys import HASH_PREFIX, KeyDirectory, KeyedHash, key_hash


@pytest.mark.parametrize(
    "secret",
    ["0123456789abcdef", "s" * 63, "s" * 64, "s" * 65, "x" * 200, "clé-secrète-ünïcode-42"],
)
@pytest.mark.parametrize("key", ["sk-bench", "", "k" * 300, "clé-ü"])
def test_keyed_hash_is_hmac_sha256(secret: str, key: str) -> None:
    # the oracle: the standard library's HMAC, not the module's own key_hash
    expected = hmac.new(secret.encode(), key.encode(), hashlib.sha256).hexdigest()
    assert KeyedHash.of(secret)(key) == HASH_PREFIX + expected == key_hash(secret, key)


def test_directory_finds_keys_and_only_them() -> None:
    d = KeyDirectory.build(
        "0123456789abcdef", {"team": ["sk-a", key_hash("0123456789abcdef", "sk-b")]}
    )
    assert d.entitlement_of("sk-a") == "team"
    assert d.entitlement_of("sk-b") == "team"
    assert d.entitlement_of("sk-c") is None
    d.set_managed("other", [key_hash("0123456789abcdef", "sk-d")])
    assert d.entitlement_of("sk-d") == "other"
    assert KeyDirectory.build(None, {}).entitlement_of("sk-a") is None


def test_directory_names_the_owner_of_a_key_another_entitlement_holds() -> None:
    secret = "0123456789abcdef"
    d = KeyDirectory.build(secret, {"team": ["sk-a"]})
    d.set_managed("other", [key_hash(secret, "sk-d")])
    assert d.owner_elsewhere("mine", [key_hash(secret, "sk-a")]) == "team"
    assert d.owner_elsewhere("mine", [key_hash(secret, "sk-d")]) == "other"
    assert d.owner_elsewhere("team", [key_hash(secret, "sk-a")]) is None
    assert d.owner_elsewhere("other", [key_hash(secret, "sk-d")]) is None
    assert d.owner_elsewhere("mine", [key_hash(secret, "sk-new")]) is None
