"""Every error code of the catalogue (`domain/issues.py`) is named by a test of this service.

Read from the test sources, so the check holds whichever tests run and in whatever order; the tests
that name a code assert that their input produces it."""

import ast
from pathlib import Path

import pytest

from whetstone.ingest.domain.issues import ERROR_CODES

pytestmark = pytest.mark.unit
TESTS = Path(__file__).resolve().parents[1]


def _strings(path: Path) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def test_every_error_code_is_named_by_a_test():
    named = set().union(*(_strings(p) for p in TESTS.rglob("test_*.py") if p.resolve() != Path(__file__).resolve()))
    missing = set(ERROR_CODES) - named
    assert not missing, f"error codes no test names: {sorted(missing)}"
