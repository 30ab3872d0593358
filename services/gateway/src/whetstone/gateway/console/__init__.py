"""The web console: static ES modules served at `/`, signed in with an API key exchanged for a
server-side session (see sessions.py); it shows only what the public `/v1` API answers."""
