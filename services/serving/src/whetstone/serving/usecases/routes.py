"""A/B routes: a model name split between the tenant's live versions by weight."""

from __future__ import annotations

from dataclasses import dataclass

from ..context import ServingContext
from ..domain.catalog import ModelNotDeployed, ModelNotFound
from ..domain.routing import Route, make_route


@dataclass(frozen=True)
class VariantView:
    model: str
    weight: float
    requests: int   # served through the route since this replica started


@dataclass(frozen=True)
class RouteView:
    name: str
    variants: list[VariantView]


def view(ctx: ServingContext, tenant_id: str, name: str) -> RouteView | None:
    route = ctx.catalog.routes.get((tenant_id, name))
    if route is None:
        return None
    return RouteView(name, [VariantView(v.model_id, v.weight, ctx.served.get((tenant_id, name, v.model_id), 0))
                            for v in route.variants])


def views(ctx: ServingContext, tenant_id: str) -> list[RouteView]:
    """Every route of the tenant, by name."""
    names = sorted(name for (tenant, name), route in ctx.catalog.routes.items() if tenant == tenant_id and route)
    return [found for name in names if (found := view(ctx, tenant_id, name)) is not None]


async def put_route(ctx: ServingContext, tenant_id: str, name: str, variants: list[tuple[str, float]],
                    actor: str) -> Route:
    """Only the tenant's staging and production versions take traffic. Raises ServingError."""
    route = make_route(name, variants)
    versions = ctx.catalog.owned(tenant_id, [v.model_id for v in route.variants])
    for i, v in enumerate(route.variants):
        found = versions.get(v.model_id)
        if found is None:
            raise ModelNotFound(f"The model `{v.model_id}` does not exist or you do not have access to it.",
                                param=f"variants.{i}.model")
        if not found.servable:
            raise ModelNotDeployed(f"The model `{v.model_id}` is {found.stage}: only staging and production "
                                   "versions can take traffic.", param=f"variants.{i}.model")
    await ctx.repo.put_route(tenant_id, route, actor)
    ctx.catalog.put_route(tenant_id, name, route)  # this replica at once; others follow
    return route


async def delete_route(ctx: ServingContext, tenant_id: str, name: str, actor: str) -> bool:
    if not await ctx.repo.delete_route(tenant_id, name, actor):
        return False
    ctx.catalog.put_route(tenant_id, name, None)
    return True
