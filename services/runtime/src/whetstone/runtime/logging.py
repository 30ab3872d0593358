"""structlog JSON logs, bound with event_id / job_id / tenant_id / trace_id."""

from __future__ import annotations

import io
import logging
import sys
from typing import TextIO, cast

import structlog

_configured = False


class _CurrentStderr(io.TextIOBase):
    """Writes to whatever `sys.stderr` is at the time of writing, not at configuration: logging is
    configured once per process, and a stream captured then (a test runner's capture, since closed)
    must not receive every later line."""

    def write(self, s: str) -> int:
        return sys.stderr.write(s)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "INFO", json: bool = True) -> None:
    global _configured
    if _configured:
        return
    _configured = True
    stderr = cast(TextIO, _CurrentStderr())
    logging.basicConfig(stream=stderr, level=level.upper(), format="%(message)s")
    for noisy in ("aiokafka", "botocore", "urllib3", "uvicorn.access", "faststream", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
