"""What `whet` does when something fails: one line on stderr and an exit code, never a traceback
(`WHETSTONE_DEBUG=1` shows it).

Exit codes: 0 done, 1 refused by the API / the job failed / anything else that went wrong,
2 bad arguments or a file that cannot be used (argparse's own, BadInput), 3 the API or a service
could not be reached, 130 interrupted (Ctrl-C), 141 the output was closed early (a broken pipe, e.g. `| head -1`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import httpx

from .client import ApiFailure

UNREACHABLE, INTERRUPTED, BROKEN_PIPE, BAD_INPUT = 3, 130, 141, 2


class BadInput(Exception):
    """A file or argument the command cannot use (a grader file that is not JSON, a missing file):
    the message names it; exit code 2, as argparse's own usage errors."""


def _say(message: str) -> None:
    try:
        print(f"whet: {message}", file=sys.stderr, flush=True)
    except (BrokenPipeError, OSError):
        pass


def _detach_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so that the interpreter's last flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def unreachable_message(exc: httpx.TransportError) -> str:
    try:
        where = f"{exc.request.url.scheme}://{exc.request.url.netloc.decode()}"
    except RuntimeError:     # no request attached
        where = "the API"
    reason = str(exc) or type(exc).__name__
    return (f"cannot reach {where} ({reason}). Is `whet dev` running, and is WHETSTONE_BASE_URL "
            f"(now {os.environ.get('WHETSTONE_BASE_URL', 'unset: http://127.0.0.1:8000/v1')}) right?")


def guarded_main(run: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    if os.environ.get("WHETSTONE_DEBUG"):
        return run(argv)
    try:
        try:
            code = run(argv)
        except SystemExit:
            sys.stdout.flush()      # argparse's --help and usage errors: a closed pipe surfaces here, not at exit
            raise
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        _say("interrupted")
        return INTERRUPTED
    except BrokenPipeError:
        _detach_stdout()
        _say("output closed early (broken pipe)")
        return BROKEN_PIPE
    except httpx.TransportError as exc:
        _say(unreachable_message(exc))
        return UNREACHABLE
    except ApiFailure as exc:
        _say(f"error: {exc}")
        return 1
    except BadInput as exc:
        _say(f"error: {exc}")
        return BAD_INPUT
    except TimeoutError as exc:
        _say(f"timed out: {exc}")
        return 1
    except Exception as exc:  # noqa: BLE001 - the last word for the user; WHETSTONE_DEBUG=1 re-raises
        _say(f"{type(exc).__name__}: {exc} (WHETSTONE_DEBUG=1 shows the traceback)")
        return 1
