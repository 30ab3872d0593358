"""`whet keys create|create-producer|list|revoke`: API keys and producer tokens (for external
`job.requested` producers; set the token in the envelope's `producer_token`), managed by an operator who holds the internal secret
(WHETSTONE_INTERNAL_SECRET or <data_dir>/internal.secret), talking to the scheduler directly.
With `--via-api`, an `admin` key (WHETSTONE_API_KEY) manages its own tenant's keys through the
public API instead."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import httpx

from .api_objects import ApiKey, Page
from .client import Api, ApiFailure, dumps, error_of


def scheduler_url() -> str:
    explicit = os.environ.get("WHETSTONE_SCHEDULER_URL")
    if explicit:
        return explicit.rstrip("/")
    return f"http://127.0.0.1:{os.environ.get('WHETSTONE_SCHEDULER_HTTP_PORT', '8100')}"


def operator_call(method: str, path: str, body: dict | None = None, params: dict | None = None,
                  base_url: str | None = None) -> Any:
    """A call to the scheduler signed with the internal secret (never a tenant's key)."""
    from whetstone.runtime.identity import InternalAuth, internal_secret
    from whetstone.runtime.settings import CommonSettings

    secret = internal_secret(CommonSettings().data_dir)
    try:
        r = httpx.request(method, (base_url or scheduler_url()) + path, json=body, params=params,
                          auth=InternalAuth(secret), timeout=30)
    except httpx.HTTPError as exc:
        raise SystemExit(f"scheduler not reachable at {base_url or scheduler_url()} ({type(exc).__name__}): "
                         "is `whet dev` running? (set WHETSTONE_SCHEDULER_URL)") from exc
    if r.status_code >= 400:
        raise ApiFailure(r.status_code, error_of(r))
    return r.json()


def key_body(tenant: str, name: str = "", scopes: list[str] | None = None, rate_limit: float | None = None) -> dict:
    """The create body; unset fields are left to the scheduler's defaults (scopes: read + write)."""
    body = {"tenant_id": tenant, "name": name, "scopes": scopes or None, "rate_limit_per_s": rate_limit}
    return {k: v for k, v in body.items() if v is not None}


def create_key(tenant: str, *, name: str = "", scopes: list[str] | None = None, rate_limit: float | None = None,
               base_url: str | None = None) -> dict:
    return operator_call("POST", "/v1/keys", key_body(tenant, name, scopes, rate_limit), base_url=base_url)


def create_producer_token(tenant: str, *, name: str = "", base_url: str | None = None) -> dict:
    return operator_call("POST", "/v1/keys/producer_tokens", {"tenant_id": tenant, "name": name}, base_url=base_url)


def _print_key(k: ApiKey) -> None:
    kind = "  producer-token" if k.object == "producer_token" else ""
    print(f"{k.id}{kind}  tenant={k.tenant_id}  name={k.name or '-'}  scopes={','.join(k.scopes)}  status={k.status}")


def cmd_keys(args: argparse.Namespace) -> int:
    try:
        if args.action == "create":
            if args.via_api:
                with Api() as api:
                    key = api.post("/keys", key_body(args.tenant, args.name or "", args.scope, args.rate_limit))
            else:
                key = create_key(args.tenant, name=args.name or "", scopes=args.scope, rate_limit=args.rate_limit)
            if args.json:
                print(dumps(key))
            else:
                _print_key(ApiKey.from_api(key))
                print("the key below is shown once; it is stored only as a hash:", file=sys.stderr)
            print(ApiKey.from_api(key).key)  # always the last line
        elif args.action == "create-producer":
            if args.via_api:
                with Api() as api:
                    token = api.post("/keys/producer_tokens", {"tenant_id": args.tenant, "name": args.name or ""})
            else:
                token = create_producer_token(args.tenant, name=args.name or "")
            if args.json:
                print(dumps(token))
            else:
                _print_key(ApiKey.from_api(token))
                print("the producer token below is shown once; put it in each job.requested envelope's "
                      "`producer_token`:", file=sys.stderr)
            print(ApiKey.from_api(token).token)  # always the last line
        elif args.action == "list":
            if args.via_api:
                with Api() as api:
                    page = api.get("/keys")
            else:
                page = operator_call("GET", "/v1/keys", params={"tenant_id": args.tenant} if args.tenant else None)
            if args.json:
                print(dumps(page))
            for k in [] if args.json else Page[ApiKey].from_api(page).data or []:
                _print_key(k)
        else:
            if args.via_api:
                with Api() as api:
                    key = api.post(f"/keys/{args.key_id}/revoke")
            else:
                key = operator_call("POST", f"/v1/keys/{args.key_id}/revoke")
            revoked = ApiKey.from_api(key)
            print(dumps(key) if args.json else f"revoked {revoked.id} (tenant {revoked.tenant_id})")
    except ApiFailure as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub) -> None:
    keys = sub.add_parser("keys", help="API keys (operator: internal secret; --via-api: an admin key)")
    actions = keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="a new key for TENANT, printed on the last line (shown once)")
    create.add_argument("tenant")
    create.add_argument("--name", default="", help="a label shown by `whet keys list`")
    create.add_argument("--scope", action="append", choices=["read", "write", "models:promote", "admin"],
                        help="repeatable; default read + write")
    create.add_argument("--rate-limit", type=float, help="requests per second for this key")
    producer = actions.add_parser("create-producer", help="a producer token for TENANT's external job.requested "
                                  "producers, printed on the last line (shown once); revoke it like a key")
    producer.add_argument("tenant")
    producer.add_argument("--name", default="", help="a label shown by `whet keys list`")
    lst = actions.add_parser("list", help="keys and producer tokens (never their secrets)")
    lst.add_argument("--tenant", help="only this tenant's (operator)")
    revoke = actions.add_parser("revoke", help="revoke a key or producer token at once (within 2 s everywhere)")
    revoke.add_argument("key_id")
    for p in (create, producer, lst, revoke):
        p.add_argument("--json", action="store_true", help="print the API's JSON object (lists: the list object)")
        p.add_argument("--via-api", action="store_true", help="use WHETSTONE_API_KEY (admin scope) and the public API")
        p.set_defaults(fn=cmd_keys)
