"""Postgres side of job templates: immutable versions per (tenant, name); a new POST of a name
writes version n+1 (one writer per name at a time)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import asyncpg


def _view(row: asyncpg.Record) -> dict[str, Any]:
    return {"object": "job_template", "id": f"{row['name']}@{row['version']}", "name": row["name"],
            "version": row["version"], "description": row["description"], "created_at": int(row["created_at"].timestamp()),
            "template": json.loads(row["body"]) if isinstance(row["body"], str) else row["body"]}


class TemplateStore:
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def add(self, tenant_id: str, name: str, description: str, body: dict[str, Any],
                  now: datetime) -> dict[str, Any]:
        await self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('template:' || $1 || ':' || $2, 0))",
                                tenant_id, name)
        row = await self.conn.fetchrow(
            "INSERT INTO job_templates (tenant_id, name, version, description, body, created_at)"
            " SELECT $1, $2, coalesce(max(version), 0) + 1, $3, $4::jsonb, $5 FROM job_templates"
            " WHERE tenant_id = $1 AND name = $2 RETURNING *", tenant_id, name, description, json.dumps(body), now)
        return _view(row)

    async def get(self, tenant_id: str, name: str, version: int | None = None) -> dict[str, Any] | None:
        if version is None:
            row = await self.conn.fetchrow("SELECT * FROM job_templates WHERE tenant_id = $1 AND name = $2"
                                           " ORDER BY version DESC LIMIT 1", tenant_id, name)
        else:
            row = await self.conn.fetchrow("SELECT * FROM job_templates WHERE tenant_id = $1 AND name = $2"
                                           " AND version = $3", tenant_id, name, version)
        return _view(row) if row else None

    async def latest(self, tenant_id: str) -> list[dict[str, Any]]:
        rows = await self.conn.fetch("SELECT DISTINCT ON (name) * FROM job_templates WHERE tenant_id = $1"
                                     " ORDER BY name, version DESC", tenant_id)
        return [_view(r) for r in rows]

    async def versions(self, tenant_id: str, name: str) -> list[dict[str, Any]]:
        rows = await self.conn.fetch("SELECT * FROM job_templates WHERE tenant_id = $1 AND name = $2"
                                     " ORDER BY version DESC", tenant_id, name)
        return [_view(r) for r in rows]
