#!/bin/sh
# Installs Debian's prometheus (prometheus + promtool) when missing; idempotent. Used by `make test`
# (tests/ops) on a fresh CI machine running as root; elsewhere it says what is missing and exits 0.
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus) \
        >/dev/null || echo "ensure-prometheus: apt-get install prometheus failed; tests/ops will skip the Prometheus tests"
    # the package enables a system service; the tests run their own Prometheus
    if command -v service >/dev/null 2>&1; then service prometheus stop >/dev/null 2>&1 || true; fi
else
    echo "ensure-prometheus: prometheus/promtool missing (apt-get install prometheus as root); tests/ops will skip them"
fi
exit 0
