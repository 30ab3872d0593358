"""Alert rules: `promtool check rules` and `promtool test rules` (a unit test for every alert),
and a runbook line in the README for every alert."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool missing: `apt-get install prometheus` (make test runs "
                             "deploy/tools/ensure-prometheus.sh, which installs it as root)")


def rule_specs() -> dict[str, dict]:
    """PrometheusRule CRs listed by the kustomization -> their `spec` (a plain Prometheus rule file)."""
    listed = yaml.safe_load((RULES / "kustomization.yaml").read_text())["resources"]
    return {name: yaml.safe_load((RULES / name).read_text())["spec"] for name in listed}


def alerts(spec: dict) -> list[str]:
    return [r["alert"] for g in spec["groups"] for r in g["rules"] if "alert" in r]


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    for name, spec in rule_specs().items():
        (tmp_path / name.replace(".yaml", ".rules.yaml")).write_text(yaml.safe_dump(spec, sort_keys=False))
    for test in (RULES / "tests").glob("*.test.yaml"):
        shutil.copy(test, tmp_path / test.name)
    return tmp_path


def test_every_rule_file_is_deployed():
    assert set(rule_specs()) == {p.name for p in RULES.glob("*-rules.yaml")}


@needs_promtool
def test_promtool_check_rules(rules_dir: Path):
    files = sorted(str(p) for p in rules_dir.glob("*.rules.yaml"))
    r = subprocess.run([PROMTOOL, "check", "rules", *files], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_unit_tests_cover_every_alert(rules_dir: Path):
    tests = sorted(rules_dir.glob("*.test.yaml"))
    tested: set[str] = set()
    for t in tests:
        for case in yaml.safe_load(t.read_text())["tests"]:
            for a in case.get("alert_rule_test", []):
                if a.get("exp_alerts"):  # a test that shows it fires, not only that it stays quiet
                    tested.add(a["alertname"])
    defined = {a for spec in rule_specs().values() for a in alerts(spec)}
    assert defined - tested == set(), "alerts without a firing unit test"
    r = subprocess.run([PROMTOOL, "test", "rules", *[t.name for t in tests]], cwd=rules_dir,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(tests), r.stdout


def test_every_platform_alert_has_a_runbook_line_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    spec = rule_specs()["platform-rules.yaml"]
    for alert in alerts(spec):
        line = re.search(rf"^.*\b{alert}\b.*$", readme, re.M)
        assert line and len(line.group(0)) > len(alert) + 30, f"README has no runbook line for {alert}"
    for rule in (r for g in spec["groups"] for r in g["rules"] if "alert" in r):
        assert rule["annotations"]["runbook"] == f"README.md#alert-{rule['alert'].lower()}"
