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
  # One xz archive of binaries and PTX (~10x smaller: the PTX is ~9 MB per arch), so that
  # this bundle and a part of the engine check's model fit one 64 MiB carry together.
  XZ_OPT="-6 --lzma2=dict=256MiB" tar -C "$bundle" -cJf "$bundle/bundle.tar.xz" bin ptx
  rm -rf "$bundle/bin" "$bundle/ptx"
  du -sh "$bundle"
}

run() {
  local out=${OUT:-$bundle/out}
  mkdir -p "$out"
  local status=0
  { nvidia-smi -L || echo "nvidia-smi unavailable"; } 2>&1 | tee "$out/device.txt"
  if [ -f "$bundle/bundle.tar.xz" ] && [ ! -d "$bundle/bin" ]; then
    tar -C "$bundle" -xJf "$bundle/bundle.tar.xz"
  fi
  # cuBLAS 13 lives in the PyTorch wheels there; the bench's GEMM ceiling opens it by name.
  local cu13
  cu13=$(python3 -c 'import glob, site; d = [p for s in site.getsitepackages() for p in glob.glob(s + "/nvidia/cu13/lib")]; print(d[0] if d else "")' 2>/dev/null || true)
  [ -n "$cu13" ] && export LD_LIBRARY_PATH="$cu13${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [ -x "$bundle/bin/bench-gpu" ]; then
    export GK_PTX_DIR="$bundle/ptx"
    # Integration tests run from the package directory, as cargo runs them.
    (
      cd "$root/gpu-kernels"
      rc=0
      # The kernel tests run on the host emulator (CI runs them); on a lent GPU, where
      # minutes count, only when GPU_CHECK_TESTS=1.
      [ "${GPU_CHECK_TESTS:-0}" = 1 ] || { echo "kernel tests skipped (GPU_CHECK_TESTS=1 runs them)"; exit 0; }
      for t in "$bundle"/bin/test-*; do
        echo "== $(basename "$t")"
        timeout "${GPU_TEST_TIMEOUT:-90}" "$t" || { echo "!! $(basename "$t") rc $?"; rc=1; }
      done
      exit $rc
    ) >"$out/tests.log" 2>&1 || status=1
    timeout "${GPU_BENCH_TIMEOUT:-180}" "$bundle/bin/bench-gpu" >"$out/bench-gpu.log" 2>&1 || status=1
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
