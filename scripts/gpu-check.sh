#!/usr/bin/env bash
# GPU check of gpu-kernels: the kernel tests and the CUDA-event benchmark on a GPU machine.
#
#   scripts/gpu-check.sh prepare   # HERE (no GPU needed): build PTX and binaries into
#                                  # target/gpu-check (nightly is used only here)
#   scripts/gpu-check.sh [run]     # THERE (GPU machine): run them, logs to $OUT if set
#
# The GPU machine has no network, so nothing is built there when the prepared bundle is
# present: `prepare` runs `cargo xtask build-ptx` (nightly + ptxas, here), copies
# target/ptx/sm_{80,90}/gpu_kernels.ptx into target/gpu-check/ptx/, and compiles the
# `cargo test -p gpu-kernels` test executables and the
# `cargo bench -p gpu-kernels --features cuda --bench gpu` executable into
# target/gpu-check/bin/ (stripped). target/ is git-ignored, so the device tool must be
# told to carry it:   carry: ["target/gpu-check"]   command: "bash scripts/gpu-check.sh"
#
# Without a bundle, `run` falls back to cargo (stable only, --offline) with the PTX in
# target/ptx (carry "target/ptx/sm_80/gpu_kernels.ptx" and "target/ptx/sm_90/gpu_kernels.ptx").
#
# Exit status: non-zero if any test or the benchmark (validation included) fails.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bundle="$root/target/gpu-check"
mode=${1:-run}

# shellcheck source=scripts/lib.sh
source "$root/scripts/lib.sh"

prepare() {
  cd "$root"
  cargo xtask build-ptx
  rm -rf "$bundle"
  mkdir -p "$bundle/bin" "$bundle/ptx/sm_80" "$bundle/ptx/sm_90"
  for arch in sm_80 sm_90; do
    cp "target/ptx/$arch/gpu_kernels.ptx" "$bundle/ptx/$arch/"
  done
  cargo test -p gpu-kernels --no-run --message-format=json | json_executables |
    while read -r exe; do
      name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
      cp "$exe" "$bundle/bin/test-$name"
    done
  cargo bench -p gpu-kernels --features cuda --bench gpu --no-run --message-format=json |
    json_executables | while read -r exe; do cp "$exe" "$bundle/bin/bench-gpu"; done
  strip "$bundle"/bin/* 2>/dev/null || true
  ls -l "$bundle/bin"
  du -sh "$bundle"
}

run() {
  local out=${OUT:-$bundle/out}
  mkdir -p "$out"
  local status=0
  { nvidia-smi -L || echo "nvidia-smi unavailable"; } 2>&1 | tee "$out/device.txt"
  if [ -x "$bundle/bin/bench-gpu" ]; then
    export GK_PTX_DIR="$bundle/ptx"
    # Integration tests run from the package directory, as cargo runs them.
    (
      cd "$root/gpu-kernels"
      for t in "$bundle"/bin/test-*; do
        echo "== $(basename "$t")"
        "$t" || exit 1
      done
    ) >"$out/tests.log" 2>&1 || status=1
    "$bundle/bin/bench-gpu" >"$out/bench-gpu.log" 2>&1 || status=1
  elif command -v cargo >/dev/null; then
    export GK_PTX_DIR="$root/target/ptx"
    (cd "$root" && cargo test --offline -p gpu-kernels) >"$out/tests.log" 2>&1 || status=1
    (cd "$root" && cargo bench --offline -p gpu-kernels --features cuda --bench gpu) \
      >"$out/bench-gpu.log" 2>&1 || status=1
  else
    echo "no prepared bundle in $bundle and no cargo: run 'scripts/gpu-check.sh prepare' here" \
      "and carry target/gpu-check" | tee "$out/error.txt"
    exit 2
  fi
  echo "== tests (tail)"; tail -n 40 "$out/tests.log"
  echo "== bench-gpu"; cat "$out/bench-gpu.log"
  echo "gpu-check status $status"
  return $status
}

case "$mode" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: $0 [prepare|run]" >&2; exit 2 ;;
esac
