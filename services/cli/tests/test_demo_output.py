"""`make demo` output: the services' and libraries' writes to fds 1 and 2 land in the log file; the demo's
own lines and the job's progress reach the terminal's original streams. Run in a child process, whose
sys.stdout and sys.stderr write to fds 1 and 2 as in `whet demo` (pytest's capture replaces them here)."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

CHILD = """
import os, sys
from whetstone.cli.demo import library_output_to, say
say("[before] own line")
from pathlib import Path
with library_output_to(Path(sys.argv[1])) as progress:
    os.write(1, b"lm-eval progress bar on fd 1\\n")
    os.write(2, b"bitsandbytes warning on fd 2\\n")
    print("a library's print()", flush=True)
    print("a library's stderr line", file=sys.stderr, flush=True)
    say("[job] own line")
    progress.write("running  step 3/56\\n")
    progress.flush()
say("[after] own line")
"""


def test_library_output_goes_to_the_log_and_the_demos_lines_to_the_terminal(tmp_path):
    log = tmp_path / "demo.log"
    done = subprocess.run([sys.executable, "-c", CHILD, str(log)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[before] own line\n[job] own line\n[after] own line\n"
    assert done.stderr == "running  step 3/56\n"
    assert log.read_text().splitlines() == ["lm-eval progress bar on fd 1", "bitsandbytes warning on fd 2",
                                            "a library's print()", "a library's stderr line"]
