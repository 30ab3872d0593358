"""The answers every API shares (runtime.http): OpenAI's list object, served by a real FastAPI app
and read by its OpenAPI document; the 404 and operator-only errors in OpenAI's shape."""

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel
from whetstone.runtime.errors import install_error_handlers
from whetstone.runtime.http import ListObject, ListPage, list_object, list_page, not_found, operator_only
from whetstone.runtime.identity import PLATFORM_TENANT, Caller

pytestmark = pytest.mark.unit


class Item(BaseModel):
    id: str
    size: int


def app() -> FastAPI:
    a = FastAPI()
    install_error_handlers(a)

    @a.get("/items")
    def items(empty: bool = False) -> ListPage[Item]:
        return list_page([] if empty else [Item(id="a", size=1), Item(id="b", size=2)], has_more=not empty)

    @a.get("/events")
    def events() -> ListObject[dict[str, Any]]:
        return list_object([{"id": "e1"}])

    @a.get("/missing")
    def missing() -> None:
        raise not_found("No such thing: x", code="thing_not_found", param="thing_id")

    @a.get("/ops")
    def ops(platform: bool = False) -> dict[str, bool]:
        operator_only(Caller(tenant_id=PLATFORM_TENANT if platform else "acme", key_id="k", scopes=frozenset({"admin"})))
        return {"ok": True}

    return a


def test_list_object_carries_ids_only_where_the_route_pages_by_id() -> None:
    client = TestClient(app())
    assert client.get("/items").json() == {"object": "list", "data": [{"id": "a", "size": 1}, {"id": "b", "size": 2}],
                                           "has_more": True, "first_id": "a", "last_id": "b"}
    assert client.get("/items", params={"empty": True}).json() == {"object": "list", "data": [], "has_more": False,
                                                                     "first_id": None, "last_id": None}
    assert client.get("/events").json() == {"object": "list", "data": [{"id": "e1"}], "has_more": False}


def test_openapi_describes_the_list_items() -> None:
    schemas = app().openapi()["components"]["schemas"]
    page = next(s for name, s in schemas.items() if name.startswith("ListPage") and "Item" in name)
    assert page["properties"]["data"]["items"] == {"$ref": "#/components/schemas/Item"}
    assert page["properties"]["object"]["const"] == "list"
    assert set(page["required"]) == {"data", "has_more", "first_id", "last_id"}


def test_not_found_and_operator_only_answer_in_openai_shape() -> None:
    client = TestClient(app())
    r = client.get("/missing")
    assert r.status_code == 404 and r.headers["x-should-retry"] == "false"
    assert r.json() == {"error": {"message": "No such thing: x", "type": "invalid_request_error",
                                  "param": "thing_id", "code": "thing_not_found"}}
    r = client.get("/ops")
    assert r.status_code == 403 and r.json()["error"]["code"] == "operator_only"
    assert r.json()["error"]["type"] == "permission_error"
    assert client.get("/ops", params={"platform": True}).json() == {"ok": True}
