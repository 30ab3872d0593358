"""A/B routing: a model name split between versions by weight, sticky per caller-supplied user. Pure."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from .catalog import ServingError

MAX_VARIANTS = 4


class InvalidRoute(ServingError):
    status, code = 400, "invalid_route"


@dataclass(frozen=True)
class Variant:
    model_id: str
    weight: float


@dataclass(frozen=True)
class Route:
    name: str
    variants: tuple[Variant, ...]


def make_route(name: str, variants: Sequence[tuple[str, float]]) -> Route:
    if not 1 <= len(variants) <= MAX_VARIANTS:
        raise InvalidRoute(f"a route needs 1 to {MAX_VARIANTS} variants, got {len(variants)}", param="variants")
    seen: set[str] = set()
    for i, (model_id, weight) in enumerate(variants):
        if model_id in seen:
            raise InvalidRoute(f"variants[{i}].model: {model_id} appears twice", param=f"variants.{i}.model")
        seen.add(model_id)
        if not weight >= 0:
            raise InvalidRoute(f"variants[{i}].weight must be >= 0", param=f"variants.{i}.weight")
    if sum(w for _, w in variants) <= 0:
        raise InvalidRoute("the weights of a route must not all be 0", param="variants")
    return Route(name, tuple(Variant(m, float(w)) for m, w in variants))


def bucket(route_name: str, user: str) -> float:
    """A stable point in [0, 1) for (route, user): the same user always lands on the same side."""
    digest = hashlib.sha256(f"{route_name}\0{user}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def pick_variant(route: Route, user: str | None, random_point: float) -> Variant:
    """Sticky when `user` is given; `random_point` in [0, 1) decides otherwise."""
    point = bucket(route.name, user) if user else random_point
    total = sum(v.weight for v in route.variants)
    target, acc = point * total, 0.0
    live = [v for v in route.variants if v.weight > 0]
    for v in live:
        acc += v.weight
        if target < acc:
            return v
    return live[-1]
