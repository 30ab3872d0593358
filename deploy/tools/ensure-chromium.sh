#!/bin/sh
# Installs Debian's chromium (headless browser for the console's browser tests, tests/console) when
# missing; idempotent. Used by `make test` on a fresh CI machine running as root; elsewhere it says
# what is missing and exits 0 (the browser tests then skip, naming the reason).
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver) \
        >/dev/null || echo "ensure-chromium: apt-get install chromium failed; the console's browser tests will skip"
else
    echo "ensure-chromium: /usr/bin/chromium missing (apt-get install chromium as root); the console's browser tests will skip"
fi
exit 0
