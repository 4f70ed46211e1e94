#!/usr/bin/env bash
# Installs the Debian packages the tests and the demo need, only when they are absent.
set -euo pipefail

# Each entry: "<command that proves it is installed>:<debian package>".
REQUIRED=(
    "python3:python3"
    "prometheus:prometheus"
    "chromium:chromium"
    "prometheus-alertmanager:prometheus-alertmanager"
    "faketime:faketime"  # a rank on a skewed clock (tests/ft_runtime/test_clock_skew.py)
    "ip:iproute2"  # hosts as network namespaces (tests/eagleeye/test_netns_*.py)
)

missing=()
for entry in "${REQUIRED[@]}"; do
    command -v "${entry%%:*}" >/dev/null 2>&1 || missing+=("${entry#*:}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "install-system-deps: missing Debian packages: ${missing[*]}; run as root or install them" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}"
