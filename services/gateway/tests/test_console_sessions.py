"""The console's session store and CSRF rule, pure (no IO): ids never stored, expiry, revocation,
and which state-changing requests a session cookie may make."""

import pytest

from whetstone.gateway.console.gate import cookie_session
from whetstone.gateway.console.sessions import SessionStore, csrf_problem, digest_of, parse_cookies

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_session_ids_are_stored_hashed_and_expire_when_idle_or_old():
    clock = Clock()
    store = SessionStore(idle_s=60, max_age_s=300, clock=clock)
    sid, session = store.create("wsk-secret", "key_1", "demo", ("read", "write"))
    assert sid not in store.sessions and digest_of(sid) in store.sessions
    assert store.get(sid) is session and store.get("forged") is None and store.get("x" * 500) is None
    clock.now += 59
    assert store.get(sid) is session           # used: the idle clock restarts
    clock.now += 61
    assert store.get(sid) is None              # idle too long
    sid, _ = store.create("wsk-secret", "key_1", "demo", ("read",))
    for _ in range(7):
        clock.now += 50
        store.get(sid)
    assert store.get(sid) is None              # never idle, but older than max_age_s


def test_revoking_a_key_ends_every_session_of_it():
    store = SessionStore()
    a, _ = store.create("k1", "key_1", "demo", ("read",))
    b, _ = store.create("k1", "key_1", "demo", ("read",))
    c, _ = store.create("k2", "key_2", "acme", ("read",))
    assert store.revoke_key("key_1") == 2
    assert store.get(a) is None and store.get(b) is None and store.get(c) is not None


def test_a_full_store_drops_its_oldest_sessions_first():
    clock = Clock()
    store = SessionStore(max_sessions=10, clock=clock)
    first, _ = store.create("k", "key", "demo", ("read",))
    for _ in range(9):
        clock.now += 1
        store.create("k", "key", "demo", ("read",))
    newest, _ = store.create("k", "key", "demo", ("read",))
    assert store.get(first) is None and store.get(newest) is not None and len(store.sessions) <= 10


def test_parse_cookies_keeps_the_first_of_a_name():
    assert parse_cookies('a=1; b="2"; a=3;junk; =x') == {"a": "1", "b": "2"}
    assert parse_cookies(None) == {}


def headers(sid: str, csrf_cookie: str | None, csrf_header: str | None, **more: str) -> dict[str, str]:
    cookie = f"whet_session={sid}" + (f"; whet_csrf={csrf_cookie}" if csrf_cookie is not None else "")
    out = {"cookie": cookie, "host": "127.0.0.1:8000", **more}
    if csrf_header is not None:
        out["x-csrf-token"] = csrf_header
    return out


def test_csrf_token_is_needed_twice_and_must_be_the_sessions_own():
    store = SessionStore()
    sid, s = store.create("k", "key", "demo", ("read", "write"))
    other_sid, other = store.create("k2", "key2", "acme", ("read", "write"))
    assert csrf_problem("GET", headers(sid, None, None), s) is None            # reads need none
    assert csrf_problem("POST", headers(sid, s.csrf, s.csrf), s) is None
    assert "missing" in csrf_problem("POST", headers(sid, s.csrf, None), s)
    assert "does not match" in csrf_problem("POST", headers(sid, s.csrf, "forged"), s)
    assert "does not match" in csrf_problem("DELETE", headers(sid, "forged", "forged"), s)   # double-submit of a guess
    assert "does not match" in csrf_problem("POST", headers(sid, other.csrf, other.csrf), s)  # another session's token
    assert "cross-origin" in csrf_problem("POST", headers(sid, s.csrf, s.csrf, origin="https://evil.example"), s)
    assert "cross-origin" in csrf_problem("POST", headers(sid, s.csrf, s.csrf, origin="null"), s)
    assert csrf_problem("POST", headers(sid, s.csrf, s.csrf, origin="http://127.0.0.1:8000"), s) is None
    assert other_sid != sid


def test_only_a_request_without_authorization_is_authenticated_by_its_cookie():
    store = SessionStore()
    sid, s = store.create("k", "key", "demo", ("read",))
    assert cookie_session(store, "GET", headers(sid, None, None)) == (s, None)
    assert cookie_session(store, "GET", {**headers(sid, None, None), "authorization": "Bearer other"}) == (None, None)
    assert cookie_session(store, "POST", {**headers(sid, None, None), "authorization": "Bearer other"}) == (None, None)
    session, refusal = cookie_session(store, "POST", headers(sid, s.csrf, None))
    assert session is s and refusal is not None and refusal.status == 403 and refusal.code == "csrf_failed"
    assert cookie_session(store, "POST", headers("unknown", "x", "x")) == (None, None)
