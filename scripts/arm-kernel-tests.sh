#!/usr/bin/env bash
# The CPU kernel tests on aarch64, cross-built on an x86-64 Linux machine and
# run under qemu-user: std is built from source by nightly's -Zbuild-std
# (nightly with rust-src must be installed), the linker and runner come from
# .cargo/config.toml. Takes ~25 minutes on 2 cores the first time (std and
# the whole dependency tree), a few minutes after an engine change.
#
# Usage: scripts/arm-kernel-tests.sh [TEST FILTER, default: quant]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
    echo "installing the cross compiler and qemu-user (Debian packages)" >&2
    apt-get install -y -q gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/aarch64-cross}"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
exec cargo +nightly test -Zbuild-std --target aarch64-unknown-linux-gnu -p engine --lib "${1:-quant}"
