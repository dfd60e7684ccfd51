#!/usr/bin/env bash
# Install Debian's headless Chromium for the browser tests when it is missing.
# Playwright drives it through executable_path=/usr/bin/chromium; no browser is downloaded.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
    echo "chromium present: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "chromium is missing and installing it needs root: sudo $0" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium
/usr/bin/chromium --version
