"""Policies registered by name, so that configuration picks them.

Every extension point of the pipeline core (policies/core.py) keeps one `Registry`: a
policy registers a factory under a name (`@ADMITTERS.register("concurrency")`), and
configuration builds it by name with its parameters (`ADMITTERS.make(name, params)`).
The registries live with their protocols (policies/protocols/); each step's module
imports its built-in policies by an explicit list, which is what fills its registry.
An unknown name or an unknown parameter fails there, at start-up, naming what is known.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")
Factory = Callable[[Mapping[str, Any]], T]


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind  # what the error messages call it: "router", "admission policy"
        self._factories: dict[str, Factory[T]] = {}

    def register(self, name: str) -> Callable[[Factory[T]], Factory[T]]:
        def deco(factory: Factory[T]) -> Factory[T]:
            if name in self._factories:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._factories[name] = factory
            return factory

        return deco

    def names(self) -> list[str]:
        return sorted(self._factories)

    def make(self, name: str, params: Mapping[str, Any] | None = None) -> T:
        """Build a policy by name; unknown names and unknown parameters fail here."""
        try:
            factory = self._factories[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._factories))}"
            ) from None
        return factory(dict(params or {}))


class ParamError(ValueError):
    """A policy parameter that cannot be used, at `path` (its key path under the policy's
    `params`, e.g. `entitlements.team-a.tokens_per_s`): the gateway's configuration error
    names `<section>.params.<path>`."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path, self.detail = path, detail


def config_from(cls: Any, params: Mapping[str, Any]) -> Any:
    """Build a frozen config dataclass from a mapping, naming any unknown key."""
    fields = set(getattr(cls, "__dataclass_fields__", {}))
    unknown = sorted(set(params) - fields)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(fields)) or 'none'}"
        )
    return cls(**params)
