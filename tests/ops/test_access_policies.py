"""Per-service S3 policies and database roles in deploy/access/ (issue 35.5): generated, parseable,
each naming only the service's own prefixes and its own schema, and covering what the code writes."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
ACCESS = ROOT / "deploy" / "access"
# a key the code builds under a tenant's prefix: f"{tenant_prefix(t)}uploads/..." or f"tenants/{t}/models/..."
TENANT_KEY = re.compile(r"""(?:tenant_prefix\([^)]*\)\}|tenants/\{[^}]+\}/)([a-z_]+)/""")


def tool():
    spec = importlib.util.spec_from_file_location("access_policies", ROOT / "deploy" / "tools" / "access_policies.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_files_are_up_to_date():
    for name, text in tool().render().items():
        assert (ACCESS / name).read_text() == text, f"deploy/access/{name} is stale: run deploy/tools/access_policies.py"


def test_s3_policies_grant_only_tenant_prefixes_and_cover_what_the_code_builds():
    t = tool()
    for path in sorted(ACCESS.glob("s3-*.json")):
        service = path.stem.removeprefix("s3-")
        policy = json.loads(path.read_text())
        assert policy["Version"] == "2012-10-17"
        granted: set[str] = set()
        for st in policy["Statement"]:
            assert st["Effect"] == "Allow" and all(a.startswith("s3:") and "*" not in a for a in st["Action"])
            for resource in st["Resource"]:
                if st["Action"] == ["s3:ListBucket"]:
                    assert resource == f"arn:aws:s3:::{t.BUCKET}"
                    prefixes = st["Condition"]["StringLike"]["s3:prefix"]
                    assert all(p.startswith("tenants/*/") and p != "tenants/*/*" for p in prefixes), prefixes
                    continue
                key = resource.removeprefix(f"arn:aws:s3:::{t.BUCKET}/")
                assert key != resource and key.startswith("tenants/*/") and key != "tenants/*/*", (service, resource)
                if "s3:PutObject" in st["Action"]:
                    granted.add(key.removeprefix("tenants/*/").split("/")[0])
        # every top-level prefix the service's own code writes keys under is granted to it for writing
        source = ROOT / "services" / service / "src"
        built = {m for f in source.rglob("*.py") for m in TENANT_KEY.findall(f.read_text())}
        reads_only = {"eval", "serving"}   # they download; nothing they build is written
        if service not in reads_only:
            assert built and built <= granted, f"{service} builds keys under {sorted(built - granted)} without a grant"
    # services whose code holds no S3 client use get no policy at all
    assert not (ACCESS / "s3-scheduler.json").exists() and not (ACCESS / "s3-metering.json").exists()


def test_postgres_roles_own_only_their_own_schema():
    t = tool()
    text = (ACCESS / "postgres-roles.sql").read_text()
    statements = [s.strip() for s in re.sub(r"--[^\n]*", "", text).split(";") if s.strip()]
    shapes = [re.compile(p) for p in (
        r"REVOKE ALL ON SCHEMA public FROM PUBLIC",
        r"CREATE ROLE (?P<role>whetstone_\w+) LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT",
        r"CREATE SCHEMA IF NOT EXISTS (?P<schema>\w+) AUTHORIZATION (?P<role>whetstone_\w+)",
        r"ALTER ROLE (?P<role>whetstone_\w+) SET search_path = (?P<schema>\w+)")]
    roles: dict[str, set[str]] = {}
    for st in statements:
        match = next((m for p in shapes if (m := p.fullmatch(st))), None)
        assert match is not None, f"unexpected statement in postgres-roles.sql: {st!r}"
        if "role" in match.groupdict():
            roles.setdefault(match["role"], set())
            if match.groupdict().get("schema"):
                roles[match["role"]].add(match["schema"])
    from whetstone.runtime.service import Service
    expected = {t.role_of(s): {Service(name=s, migrations=()).schema} for s in t.DB_SERVICES}
    assert roles == expected


def test_every_service_has_its_grants_and_the_trainer_writes_only_job_outputs():
    """Issue 35 p5: each service that touches the bucket has its own policy, each that keeps rows its own
    role; the trainer agent (the node that runs tenants' training) writes only a job's checkpoints and a
    merge's output, and reads nothing outside tenants' inputs and models."""
    t = tool()
    assert {p.stem.removeprefix("s3-") for p in ACCESS.glob("s3-*.json")} == {
        "ingest", "trainer-agent", "eval", "registry", "serving"}
    roles = (ACCESS / "postgres-roles.sql").read_text()
    from whetstone.gateway.shared_limits import SCHEMA as GATEWAY_SCHEMA   # the shared tenant rates' rows
    assert "gateway" in t.DB_SERVICES and GATEWAY_SCHEMA == t.schema_of("gateway")
    for service in t.DB_SERVICES:
        assert f"CREATE ROLE {t.role_of(service)} " in roles, service
    trainer = json.loads((ACCESS / "s3-trainer-agent.json").read_text())
    writes = {r for st in trainer["Statement"] if "s3:PutObject" in st["Action"] for r in st["Resource"]}
    assert writes == {f"arn:aws:s3:::{t.BUCKET}/tenants/*/jobs/*/checkpoints/*",
                      f"arn:aws:s3:::{t.BUCKET}/tenants/*/models/*/merged/*"}
    for policy in ("eval", "serving"):
        statements = json.loads((ACCESS / f"s3-{policy}.json").read_text())["Statement"]
        assert not any({"s3:PutObject", "s3:DeleteObject"} & set(st["Action"]) for st in statements), policy
