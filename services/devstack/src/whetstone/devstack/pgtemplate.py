"""A PostgreSQL cluster made by initdb once and copied for every later stack.

initdb costs about 1.5 s of CPU and 2 s of wall time, and a test suite starts hundreds of stacks
(a fresh one per test). The cluster it writes depends only on the binaries and initdb's options,
so the first stack keeps a copy of its freshly made data directory (before the server first
starts) in a cache, named after those; later stacks copy it (`cp -a`: ownership and modes kept,
0.2 s). A copy that is not complete never carries the final name (it is renamed into place).
Beside it, `<name>.json` lists each of its files with size and modification time; a template whose
files no longer match that list (edited, truncated or deleted by hand, or kept without a list) is
thrown away and initdb runs again, instead of every stack failing to start on a damaged copy.

The cache is `$WHETSTONE_PG_TEMPLATE_DIR`, else `$XDG_CACHE_HOME/whetstone/postgres-template`
(`~/.cache/...`); `WHETSTONE_PG_TEMPLATE_DIR=off` runs initdb every time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path


def cache_root() -> Path | None:
    configured = os.environ.get("WHETSTONE_PG_TEMPLATE_DIR")
    if configured == "off":
        return None
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "whetstone" / "postgres-template"


def template_for(bin_dir: Path, initdb_args: Sequence[str], owner: int) -> Path | None:
    """Where the cluster that `initdb initdb_args` makes with these binaries, owned by user id `owner`,
    is kept (it may not exist yet)."""
    root = cache_root()
    if root is None:
        return None
    initdb = (bin_dir / "initdb").resolve()
    st = initdb.stat()
    key = hashlib.sha256(repr((str(initdb), st.st_size, st.st_mtime_ns, list(initdb_args), owner)).encode()).hexdigest()
    return root / key[:24]


def _files(root: Path) -> dict[str, list[int]]:
    """Relative path -> [size, mtime ns] of every file under `root`."""
    out: dict[str, list[int]] = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            out[os.path.relpath(path, root)] = [st.st_size, st.st_mtime_ns]
    return out


def _listing(template: Path) -> Path:
    return template.with_name(f"{template.name}.json")


def usable(template: Path, log: Callable[[str], None]) -> bool:
    """Whether `template` is there and still exactly what was kept. A damaged one is removed (so
    that the next stack keeps a fresh copy) and False is returned: the caller runs initdb."""
    if not template.is_dir():
        return False
    try:
        if json.loads(_listing(template).read_text()) == _files(template):
            return True
        why = "its files differ from the list kept with it"
    except (OSError, ValueError) as exc:
        why = f"no readable list of its files ({exc.__class__.__name__})"
    log(f"postgres: the template cluster {template} is damaged ({why}); it is removed and initdb runs")
    trash = template.with_name(f"{template.name}.damaged-{os.getpid()}")
    try:
        os.rename(template, trash)
    except OSError:
        return False
    shutil.rmtree(trash, ignore_errors=True)
    _listing(template).unlink(missing_ok=True)
    return False


def copy_command(template: Path, pgdata: Path) -> list[str]:
    return ["cp", "-a", "--", str(template), str(pgdata)]


def keep(pgdata: Path, template: Path, log: Callable[[str], None]) -> None:
    """Copy a data directory initdb just made to `template` (all or nothing). Best effort: a
    stack that cannot write the cache still starts."""
    if template.exists():
        return
    partial = template.with_name(f"{template.name}.partial-{os.getpid()}")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(copy_command(pgdata, partial), check=True, capture_output=True)
        listing = _listing(partial)
        listing.write_text(json.dumps(_files(partial)))
        os.rename(partial, template)
        os.rename(listing, _listing(template))
        log(f"postgres: initdb's cluster kept as a template in {template}")
    except (OSError, subprocess.CalledProcessError) as exc:
        log(f"postgres: could not keep a template cluster in {template} ({exc}); initdb runs every time")
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        _listing(partial).unlink(missing_ok=True)
