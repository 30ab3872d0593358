#!/bin/sh
# Installs Debian's bubblewrap (bwrap) when missing; idempotent. Python graders (reinforcement
# fine-tuning) run tenant code inside bwrap; without it they are refused (services/graders). Used by
# `make test` on a fresh CI machine running as root; elsewhere it says what is missing and exits 0.
if command -v bwrap >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap) \
        >/dev/null || echo "ensure-bubblewrap: apt-get install bubblewrap failed; python graders will be refused"
else
    echo "ensure-bubblewrap: bwrap missing (apt-get install bubblewrap as root); python graders will be refused"
fi
exit 0
