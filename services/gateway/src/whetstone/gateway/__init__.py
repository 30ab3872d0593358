"""The public gateway: one base URL, API keys, per-key rate limits, proxying to the services."""
