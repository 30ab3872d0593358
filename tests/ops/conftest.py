"""tests/ops: a failure is printed as soon as it happens (the workload test runs minutes)."""

import sys


def pytest_runtest_logreport(report):
    if report.failed:
        sys.__stderr__.write(f"\n--- {report.nodeid} ({report.when}) failed:\n{report.longreprtext}\n")
        sys.__stderr__.flush()
