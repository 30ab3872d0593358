"""The proxy path's question about a console request: which session does its cookie name, and may it
change state (CSRF)? Only a request with no Authorization header is ever authenticated by cookie."""

from __future__ import annotations

from collections.abc import Mapping

from whetstone.runtime.errors import ApiError

from .sessions import Session, SessionStore, csrf_problem


def cookie_session(sessions: SessionStore, method: str, headers: Mapping[str, str]
                   ) -> tuple[Session | None, ApiError | None]:
    """(the session, None), (the session, why it is refused), or (None, None) when there is none."""
    if "authorization" in headers or "cookie" not in headers:
        return None, None
    session = sessions.from_headers(headers)
    if session is None:
        return None, None
    problem = csrf_problem(method, headers, session)
    if problem:
        return session, ApiError(403, f"CSRF check failed: {problem}. The console sends its session's token in "
                                 "X-CSRF-Token; API clients send Authorization: Bearer instead.",
                                 type="permission_error", code="csrf_failed")
    return session, None
