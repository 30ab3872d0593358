"""The python grader's sandbox, for real (bubblewrap, installed by deploy/tools/ensure-bubblewrap.sh):
hostile graders end as a flagged error within the limits, never a hang, a secret or a crash."""

from __future__ import annotations

import asyncio
import os

import pytest

from whetstone.graders import GraderEnvironment, GraderInvalid, GraderSettings, parse_grader, run_grader, validate

pytestmark = pytest.mark.integration

SETTINGS = GraderSettings(python_timeout_s=2.0, python_cpu_s=1, python_memory_mb=256)
ENV = GraderEnvironment(SETTINGS)
BWRAP = ENV.sandbox.mode() == "bwrap"
needs_bwrap = pytest.mark.skipif(not BWRAP, reason="bubblewrap cannot create namespaces here "
                                                   "(run deploy/tools/ensure-bubblewrap.sh)")


def grade(source: str, sample: str = "4", item: dict | None = None, env: GraderEnvironment = ENV):
    grader = parse_grader({"type": "python", "name": "py", "source": source})
    return asyncio.run(run_grader(grader, sample, item if item is not None else {"answer": "4"}, env))


@needs_bwrap
def test_a_sound_grader_scores_with_sample_and_item():
    result = grade("def grade(sample, item):\n    return float(sample['output_text'] == item['answer'])")
    assert result.reward == 1.0 and not result.metadata.errors.any()
    assert grade("def grade(sample, item):\n    return sample['output_json'] * 0.25").reward == 1.0


@needs_bwrap
@pytest.mark.parametrize("name, source, flag, detail", [
    ("raises", "def grade(s, i):\n    raise ValueError('bad item')", "python_grader_runtime_error", "ValueError: bad item"),
    ("10 GiB", "def grade(s, i):\n    b = bytearray(10 * 1024 ** 3)\n    return 1.0", "python_grader_runtime_error",
     "MemoryError"),
    ("socket", "import socket\ndef grade(s, i):\n    socket.create_connection(('1.1.1.1', 443), timeout=1)\n"
     "    return 1.0", "python_grader_runtime_error", "OSError"),
    ("fork bomb", "import os, time\ndef grade(s, i):\n    while True:\n        if os.fork() == 0:\n"
     "            time.sleep(30)\n            os._exit(0)", "python_grader_runtime_error", "Resource temporarily unavailable"),
    ("not a number", "def grade(s, i):\n    return 'high'", "python_grader_runtime_error", "returned str"),
    ("nan", "def grade(s, i):\n    return float('nan')", "python_grader_runtime_error", "finite"),
    ("exit", "import os\ndef grade(s, i):\n    os._exit(0)", "python_grader_server_error", None),
])
def test_hostile_graders_are_flagged(name, source, flag, detail):
    result = grade(source)
    errors = result.metadata.errors
    assert result.reward == 0.0 and getattr(errors, flag), (name, errors)
    if detail:
        assert detail in (errors.python_grader_runtime_error_details or ""), (name, errors)


@needs_bwrap
@pytest.mark.parametrize("source", ["def grade(s, i):\n    while True:\n        pass",
                                    "import time\ndef grade(s, i):\n    time.sleep(60)"])
def test_a_grader_that_never_returns_is_stopped(source):
    result = grade(source)
    errors = result.metadata.errors
    assert result.reward == 0.0 and errors.python_grader_server_error
    assert errors.python_grader_server_error_type in ("timeout", "cpu_limit", "killed")
    assert result.metadata.execution_time < SETTINGS.python_timeout_s + 2


@needs_bwrap
def test_no_secret_and_no_platform_file_is_visible(monkeypatch):
    os.environ["WHETSTONE_TEST_SECRET"] = "s3cr3t-value"
    try:
        env_dump = grade("def grade(s, i):\n    raise RuntimeError(open('/proc/self/environ').read())")
        parent = grade("def grade(s, i):\n    raise RuntimeError(open('/proc/1/environ').read())")
    finally:
        del os.environ["WHETSTONE_TEST_SECRET"]
    for result in (env_dump, parent):
        details = result.metadata.errors.python_grader_runtime_error_details or ""
        assert "s3cr3t" not in details and "WHETSTONE" not in details
    here = os.path.abspath(__file__)
    files = grade(f"import os\ndef grade(s, i):\n    raise RuntimeError(repr([os.path.exists({here!r}), "
                  "os.path.exists('/etc/passwd'), sorted(os.listdir('/'))]))")
    details = files.metadata.errors.python_grader_runtime_error_details or ""
    assert "[False, False," in details, details
    writes = grade("def grade(s, i):\n    open('/usr/evil', 'w').write('x')\n    return 1.0")
    assert "Read-only file system" in (writes.metadata.errors.python_grader_runtime_error_details or "")
    tmp = grade("def grade(s, i):\n    open('/tmp/scratch', 'w').write('ok')\n    return 1.0")
    assert tmp.reward == 1.0


def test_no_sandbox_refuses_python_graders_unless_unsafe_is_chosen():
    off = GraderEnvironment(GraderSettings(python_sandbox="off"))
    grader = parse_grader({"type": "python", "name": "py", "source": "def grade(s, i):\n    return 1.0"})
    with pytest.raises(GraderInvalid) as caught:
        validate(grader, off.settings, off.sandbox)
    assert caught.value.code == "python_grader_unavailable" and "WHETSTONE_GRADERS_PYTHON_SANDBOX" in caught.value.message
    refused = grade("def grade(s, i):\n    return 1.0", env=off)
    assert refused.reward == 0.0 and refused.metadata.errors.python_grader_server_error_type == "sandbox_unavailable"
    unsafe = GraderEnvironment(GraderSettings(python_sandbox="unsafe", python_timeout_s=2.0))
    validate(grader, unsafe.settings, unsafe.sandbox)
    assert grade("def grade(s, i):\n    return 0.5", env=unsafe).reward == 0.5


@needs_bwrap
def test_the_grader_runs_under_its_own_uid_and_limits_however_it_is_launched():
    """The setpriv + prlimit launcher (no hook in the child) and the preexec hook confine alike."""
    probe = ("import os, resource\ndef grade(s, i):\n"
             "    return float(os.getuid() * 1000 + len(os.getgroups()) * 100\n"
             "                 + (resource.getrlimit(resource.RLIMIT_AS)[1] == 256 * 1024 * 1024) * 10\n"
             "                 + (resource.getrlimit(resource.RLIMIT_CPU)[1] == 2))")
    hooked = GraderEnvironment(SETTINGS)
    hooked.sandbox._tools = (None, None)   # as on a machine without util-linux's setpriv and prlimit
    uid_base = SETTINGS.sandbox().uid_base
    assert ENV.sandbox.launcher(None, 1) is not None and hooked.sandbox.launcher(None, 1) is None
    for env in (ENV, hooked):
        value = grade(probe, env=env).reward
        uid = int(value // 1000)
        assert uid >= uid_base if os.getuid() == 0 and uid_base is not None else uid == os.getuid(), value
        assert value % 1000 == 11, value   # no supplementary groups; memory and CPU limits as configured
