"""Postgres side of job templates: immutable versions per (tenant, name); a new POST of a name
writes version n+1 (one writer per name at a time)."""

from __future__ import annotations

import json
from datetime import datetime

import asyncpg

from ..domain.templates import StoredTemplate, TemplateBody


def _record(row: asyncpg.Record) -> StoredTemplate:
    body = row["body"]
    return StoredTemplate(id=f"{row['name']}@{row['version']}", name=row["name"], version=row["version"],
                          description=row["description"], created_at=int(row["created_at"].timestamp()),
                          template=json.loads(body) if isinstance(body, str) else body)


class TemplateStore:
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def add(self, tenant_id: str, body: TemplateBody, now: datetime) -> StoredTemplate:
        await self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('template:' || $1 || ':' || $2, 0))",
                                tenant_id, body.name)
        row = await self.conn.fetchrow(
            "INSERT INTO job_templates (tenant_id, name, version, description, body, created_at)"
            " SELECT $1, $2, coalesce(max(version), 0) + 1, $3, $4::jsonb, $5 FROM job_templates"
            " WHERE tenant_id = $1 AND name = $2 RETURNING *", tenant_id, body.name, body.description,
            json.dumps(body.fields), now)
        return _record(row)

    async def get(self, tenant_id: str, name: str, version: int | None = None) -> StoredTemplate | None:
        if version is None:
            row = await self.conn.fetchrow("SELECT * FROM job_templates WHERE tenant_id = $1 AND name = $2"
                                           " ORDER BY version DESC LIMIT 1", tenant_id, name)
        else:
            row = await self.conn.fetchrow("SELECT * FROM job_templates WHERE tenant_id = $1 AND name = $2"
                                           " AND version = $3", tenant_id, name, version)
        return _record(row) if row else None

    async def latest(self, tenant_id: str) -> list[StoredTemplate]:
        rows = await self.conn.fetch("SELECT DISTINCT ON (name) * FROM job_templates WHERE tenant_id = $1"
                                     " ORDER BY name, version DESC", tenant_id)
        return [_record(r) for r in rows]

    async def versions(self, tenant_id: str, name: str) -> list[StoredTemplate]:
        rows = await self.conn.fetch("SELECT * FROM job_templates WHERE tenant_id = $1 AND name = $2"
                                     " ORDER BY version DESC", tenant_id, name)
        return [_record(r) for r in rows]
