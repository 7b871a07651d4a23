#!/usr/bin/env bash
# GPU check of the whole engine (issues 8 and 14): the engine tests on the CUDA executor,
# the SmolLM2 golden comparison in bf16 on CUDA, and the must-show table of issue 14:
# 256 ShareGPT prompts x 256 output tokens (token ids, greedy, ignore_eos, all at once)
# in output tok/s beside HF transformers generate() on the same ids, same GPU, bf16; one
# request's ms per output token; GPU busy % during the 256-request run. Our rows are
# measured twice: with CUDA graphs (the default) and with --enforce-eager.
#
# HERE (no GPU; nightly only for the PTX):
#   scripts/gpu-engine-check.sh prepare && scripts/gpu-check.sh prepare
#     -> target/gpu-engine        (binaries and PTX as one xz archive, the first 256
#                                  ShareGPT pairs, the GGUF's second part, the `gguf` wheel)
#     -> target/gpu-engine-model  (the GGUF's first part, GPU_MODEL_PART1_BYTES, 56 MB)
#     -> target/gpu-check         (the kernel bench, see gpu-check.sh)
# THERE, two device-tool calls made back to back (the machine stays warm ~30 s after a
# call and keeps /tmp; the 98 MB GGUF does not fit one 64 MiB carry):
#   1. carry ["target/gpu-engine-model", "target/gpu-check"]
#      command "bash scripts/gpu-engine-check.sh stash; bash scripts/gpu-check.sh run"
#      (the kernel bench, ~2 min, while the first part is stashed)
#   2. carry ["target/gpu-engine"]        command "bash scripts/gpu-engine-check.sh run"
#      (timeout_s 600). The second joins the parts, checks their sha256 and runs
#      everything, each stage under a timeout; the table is the last thing it prints
#      (also $OUT/summary.md).
#
# cuBLAS: the engine finds CUDA 12 or 13 itself (engine/src/executor/gpu/cublas_path.rs);
# `run` also points PAGED_ENGINE_CUBLAS at the PyTorch wheel's copy when python finds one.
# $OUT gets at most 8 files back: device.txt, engine-tests.log, golden-gpu.log,
# server.log, throughput.json, transformers.log, summary.md.
#
# NOTE: this version was written without a GPU machine to try it on; the previous one
# ran there (issue 14's first numbers) with the model and the cuBLAS links made by hand.
#
# Exit status: non-zero if any test fails.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bundle="$root/target/gpu-engine"
model_bundle="$root/target/gpu-engine-model"
stash_dir=/tmp/gpu-engine-model
mode=${1:-run}

# shellcheck source=scripts/lib.sh
source "$root/scripts/lib.sh"

prepare() {
  cd "$root"
  cargo xtask build-ptx
  rm -rf "$bundle"
  mkdir -p "$bundle/bin" "$bundle/ptx/sm_80" "$bundle/ptx/sm_90"
  for arch in sm_80 sm_90; do cp "target/ptx/$arch/gpu_kernels.ptx" "$bundle/ptx/$arch/"; done
  # Engine integration tests (they run on every executor, CUDA included when present).
  cargo test --release -p engine --features cuda --tests --no-run --message-format=json |
    json_executables | while read -r exe; do
      name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
      # Unit tests and the executor-free / emulator-only binaries stay here.
      case "$name" in engine|sampling_stats|scheduler_props|gpu_emulated) continue ;; esac
      cp "$exe" "$bundle/bin/engine-test-$name"
    done
  cargo test --release -p integration-tests --features cuda --test golden_gpu --no-run \
    --message-format=json | json_executables | while read -r exe; do cp "$exe" "$bundle/bin/golden-gpu"; done
  cargo build --release -p server --features cuda
  cp target/release/server "$bundle/bin/server"
  local cache=${PAGED_ENGINE_CACHE:-$HOME/.cache/paged-engine}
  # The first 256 pairs of `cargo xtask fetch-data`'s ShareGPT workload (the must-show prompts).
  head -n 256 "$cache/datasets/sharegpt-SmolLM2-135M-Instruct.Q4_1.jsonl" >"$bundle/sharegpt-256.jsonl"
  # The default GGUF in two parts (first part carried alone by the `stash` call).
  local gguf="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
  rm -rf "$model_bundle"; mkdir -p "$model_bundle"
  local split=${GPU_MODEL_PART1_BYTES:-56000000}
  head -c "$split" "$gguf" >"$model_bundle/model.part1"
  tail -c +$((split + 1)) "$gguf" >"$bundle/model.part2"
  sha256sum "$gguf" | cut -d' ' -f1 >"$bundle/model.sha256"
  # The `gguf` wheel for HF transformers' side of the table (pure Python, from PyPI).
  mkdir -p "$bundle/whl"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$bundle/whl" gguf ||
    echo "gguf wheel not fetched: the HF column will say why it could not run"
  strip "$bundle"/bin/* 2>/dev/null || true
  ls -l "$bundle/bin"
  # The binaries are ~80 MB stripped (each links tokenizers, gemm, ...), over the
  # device tool's 64 MiB carry; they share most bytes, so one xz archive with a large dictionary is much smaller.
  # The PTX (~9 MB per arch) goes into the same archive: xz makes it ~0.7 MB.
  # A dictionary larger than the whole tar lets xz share the bytes the binaries have in
  # common (with the default 8 MiB window the archive was 37 MB; see the size printed).
  XZ_OPT="-6 --lzma2=dict=256MiB" tar -C "$bundle" -cJf "$bundle/bin.tar.xz" bin ptx
  rm -rf "$bundle/bin" "$bundle/ptx"
  du -sh "$bundle" "$model_bundle"  # each must stay under the 64 MiB carry
}

# Call 1 THERE: keep the GGUF's first part in /tmp for the `run` call.
stash() {
  mkdir -p "$stash_dir"
  cp "$model_bundle/model.part1" "$stash_dir/"
  ls -l "$stash_dir"
}

find_model() {
  local joined=$stash_dir/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ -f "$stash_dir/model.part1" ] && [ -f "$bundle/model.part2" ]; then
    cat "$stash_dir/model.part1" "$bundle/model.part2" >"$joined"
    if [ "$(sha256sum "$joined" | cut -d' ' -f1)" = "$(cat "$bundle/model.sha256")" ]; then
      echo "$joined"; return
    fi
    echo "joined GGUF has the wrong sha256 (was the stash call made on this machine?)" >&2
  fi
  if [ -n "${SMOLLM2_DIR:-}" ] && [ -f "$SMOLLM2_DIR/config.json" ]; then echo "$SMOLLM2_DIR"; return; fi
  local gguf=${PAGED_ENGINE_CACHE:-$HOME/.cache/paged-engine}/models/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ -f "$gguf" ]; then echo "$gguf"; return; fi
  local hub=${HF_HOME:-$HOME/.cache/huggingface}/hub/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots
  if [ -d "$hub" ]; then
    for d in "$hub"/*; do [ -f "$d/config.json" ] && { echo "$d"; return; }; done
  fi
  echo ""
}

run() {
  local out=${OUT:-$bundle/out} status=0
  mkdir -p "$out"
  bins="$bundle/bin" ptx="$bundle/ptx"
  if [ ! -d "$bins" ]; then
    local unpacked; unpacked=$(mktemp -d)
    tar -C "$unpacked" -xJf "$bundle/bin.tar.xz"
    bins=$unpacked/bin ptx=$unpacked/ptx
  fi
  export PAGED_ENGINE_PTX_DIR="$ptx" ENGINE_TEST_EXECUTORS=cuda
  if [ -z "${PAGED_ENGINE_CUBLAS:-}" ]; then
    PAGED_ENGINE_CUBLAS=$(python3 - 2>/dev/null <<'PY' || true
import glob, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
for d in dirs:
    for pat in ("nvidia/cu13/lib/libcublas.so.13", "nvidia/cublas/lib/libcublas.so.12"):
        hits = glob.glob(f"{d}/{pat}")
        if hits:
            print(hits[0]); raise SystemExit
PY
)
    [ -n "$PAGED_ENGINE_CUBLAS" ] && export PAGED_ENGINE_CUBLAS || unset PAGED_ENGINE_CUBLAS
  fi
  # NCCL (engine-test-tp_nccl: a world of one rank all-reducing over NCCL) is opened by
  # its bare name: put the PyTorch wheel's libnccl.so.2 on the loader's path.
  local nccl_dir
  nccl_dir=$(python3 - 2>/dev/null <<'PY' || true
import glob, os, site
for d in site.getsitepackages() + [site.getusersitepackages()]:
    for pat in ("nvidia/nccl/lib/libnccl.so.2", "nvidia/cu13/lib/libnccl.so.2"):
        hits = glob.glob(f"{d}/{pat}")
        if hits:
            print(os.path.dirname(hits[0])); raise SystemExit
PY
)
  [ -n "$nccl_dir" ] && export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  { nvidia-smi -L || echo "nvidia-smi unavailable"; echo "PAGED_ENGINE_CUBLAS=${PAGED_ENGINE_CUBLAS:-(engine search)}"
    echo "NCCL: ${nccl_dir:-(not found: engine-test-tp_nccl will fail)}"; } 2>&1 | tee "$out/device.txt"
  # Every binary runs (a failure does not hide the others), each bounded so that a hang
  # cannot eat the lease: ENGINE_TEST_TIMEOUT seconds per binary (default 90).
  (
    cd "$root/engine"
    rc=0
    for t in "$bins"/engine-test-*; do
      echo "== $(basename "$t")"
      timeout "${ENGINE_TEST_TIMEOUT:-90}" "$t" --nocapture || { echo "!! $(basename "$t") rc $?"; rc=1; }
    done
    exit $rc
  ) >"$out/engine-tests.log" 2>&1 || status=1
  grep -E "^== |^!! |SKIP|test result|FAILED|panicked" "$out/engine-tests.log" | head -60
  local model; model=$(find_model)
  if [ -z "$model" ]; then
    echo "SmolLM2 not found on this machine (make the stash call first): golden and throughput skipped" |
      tee "$out/summary.md"
    return $status
  fi
  echo "model: $model" | tee -a "$out/device.txt"
  (cd "$root/tests" && PAGED_ENGINE_MODEL="$model" PAGED_ENGINE_FIXTURES="$root/tests/fixtures" \
    timeout 120 "$bins/golden-gpu" smollm2_bf16_on_cuda --nocapture) \
    >"$out/golden-gpu.log" 2>&1 || status=1
  tail -n 15 "$out/golden-gpu.log"
  throughput "$model" "$out" || status=1
  return $status
}

server_pid=""
# Kills the server by pid and waits (up to 20 s) until it is gone, so that the next one
# gets the port and all of the GPU's memory.
stop_server() {
  [ -n "$server_pid" ] || return 0
  kill "$server_pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.2; done
  kill -9 "$server_pid" 2>/dev/null || true
  server_pid=""
}
trap stop_server EXIT

# One server run of the 256 x 256 workload and the 1-request latency; its figures go into
# throughput.json under keys starting with PREFIX (ours_: CUDA graphs, the default;
# eager_: --enforce-eager). Extra arguments go to the server.
serve_bench() {
  local model=$1 out=$2 tokdir=$3 prefix=$4; shift 4
  # Never `wait` on this shell with the server running: stop_server kills it by pid.
  echo "== server $*" >>"$out/server.log"
  "$bins/server" --model "$model" --device cuda --dtype bfloat16 --port 8011 --max-num-seqs 256 \
    --served-model-name smollm2 "$@" >>"$out/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 60); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
  timeout "${SERVE_BENCH_TIMEOUT:-150}" python3 - "$bundle/sharegpt-256.jsonl" "$tokdir/tokenizer.json" "$out/throughput.json" "$prefix" <<'PY' || true
import json, os, subprocess, sys, threading, time, urllib.request
from tokenizers import Tokenizer
data, tok_path, out, prefix = sys.argv[1:5]
tok = Tokenizer.from_file(tok_path)
ids = [tok.encode(json.loads(l)["prompt"], add_special_tokens=False).ids for l in open(data)][:256]
URL = "http://127.0.0.1:8011/v1/completions"

def complete(prompt, n):
    body = json.dumps({"model": "smollm2", "prompt": prompt, "max_tokens": n,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(URL, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)["usage"]["completion_tokens"]

def busy_sampler(samples, stop):
    while not stop.is_set():
        try:
            v = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                "-i", "0"], capture_output=True, text=True, timeout=5).stdout.strip()
            samples.append((time.time(), float(v.splitlines()[0])))
        except Exception:
            pass
        time.sleep(0.25)

for p in ids[:8]:
    complete(p, 8)  # warm-up
res = json.load(open(out)) if os.path.exists(out) else {}
res.update({"prompts": len(ids), "mean_prompt_tokens": sum(map(len, ids)) / len(ids)})
got = [0] * len(ids)
def one(i):
    got[i] = complete(ids[i], 256)
samples, stop = [], threading.Event()
sampler = threading.Thread(target=busy_sampler, args=(samples, stop)); sampler.start()
threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ids))]
t0 = time.time()
for t in threads: t.start()
for t in threads: t.join()
t1 = time.time(); stop.set(); sampler.join()
res[prefix + "tokens"] = sum(got)
res[prefix + "tok_s"] = sum(got) / (t1 - t0)
# Steady decode: the middle half of the run (prefill at the start, stragglers at the end).
mid = [v for t, v in samples if t0 + 0.25 * (t1 - t0) <= t <= t0 + 0.75 * (t1 - t0)]
res[prefix + "gpu_busy_pct"] = sum(mid) / len(mid) if mid else None
t = time.time(); n = complete(ids[0], 128); res[prefix + "ms_per_token_1req"] = 1000 * (time.time() - t) / n
json.dump(res, open(out, "w"), indent=1)
print(json.dumps(res))
PY
  stop_server
}

# The must-show table: ours through the server (with and without CUDA graphs), then HF
# transformers, on the same token ids.
throughput() {
  local model=$1 out=$2 tokdir
  tokdir=$(mktemp -d)
  python3 -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
    "$root/tests/fixtures/smollm2_hf_tokenizer.zip" "$tokdir"
  rm -f "$out/throughput.json" "$out/server.log"
  serve_bench "$model" "$out" "$tokdir" ours_
  serve_bench "$model" "$out" "$tokdir" eager_ --enforce-eager
  # transformers reads a GGUF through the `gguf` package, which the machine's image lacks:
  # `prepare` puts its wheel (pure Python) in the bundle.
  if ls "$bundle"/whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gguf-site "$bundle"/whl/*.whl &&
      export PYTHONPATH=/tmp/gguf-site${PYTHONPATH:+:$PYTHONPATH}
  fi
  timeout "${HF_BENCH_TIMEOUT:-180}" python3 - "$model" "$bundle/sharegpt-256.jsonl" "$tokdir/tokenizer.json" "$out/throughput.json" \
    >"$out/transformers.log" 2>&1 <<'PY' || true
import json, os, sys, time, torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM
model_path, data, tok_path, out = sys.argv[1:5]
tok = Tokenizer.from_file(tok_path)
ids = [tok.encode(json.loads(l)["prompt"], add_special_tokens=False).ids for l in open(data)][:256]
res = json.load(open(out)) if os.path.exists(out) else {}
try:
    if model_path.endswith(".gguf"):  # needs the `gguf` package
        m = AutoModelForCausalLM.from_pretrained(os.path.dirname(model_path), gguf_file=os.path.basename(model_path),
                                                 torch_dtype=torch.bfloat16)
    else:
        m = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.bfloat16)
    m = m.cuda().eval()
    pad = 0
    L = max(map(len, ids))
    x = torch.tensor([[pad] * (L - len(p)) + p for p in ids], device="cuda")
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in ids], device="cuda")
    gen = dict(do_sample=False, pad_token_id=pad)
    with torch.no_grad():
        m.generate(input_ids=x[:2], attention_mask=mask[:2], max_new_tokens=4, **gen)  # warm-up
        torch.cuda.synchronize(); t = time.time()
        o = m.generate(input_ids=x, attention_mask=mask, max_new_tokens=256, min_new_tokens=256, **gen)
        torch.cuda.synchronize(); dt = time.time() - t
        res["hf_tok_s"] = (o.shape[1] - L) * o.shape[0] / dt
        one = torch.tensor([ids[0]], device="cuda")
        torch.cuda.synchronize(); t = time.time()
        o = m.generate(input_ids=one, max_new_tokens=128, min_new_tokens=128, **gen)
        torch.cuda.synchronize()
        res["hf_ms_per_token_1req"] = 1000 * (time.time() - t) / (o.shape[1] - one.shape[1])
except Exception as e:
    res["hf_error"] = f"{type(e).__name__}: {e}"
json.dump(res, open(out, "w"), indent=1)
print(json.dumps(res))
PY
  python3 - "$out/throughput.json" >"$out/summary.md" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
f = lambda k, fmt: (fmt.format(r[k]) if r.get(k) is not None else "n/a")
print(f"Issue 14 must-show, SmolLM2-135M bf16, {r.get('prompts', 'n/a')} ShareGPT prompts "
      f"(mean {f('mean_prompt_tokens', '{:.0f}')} tokens) x 256 output tokens, greedy, ignore_eos, all at once")
print("| measure | ours (server --device cuda, CUDA graphs) | ours, --enforce-eager | HF transformers generate() | target |")
print("|---|---|---|---|---|")
print(f"| 256 x 256 output tok/s | {f('ours_tok_s', '{:,.0f}')} | {f('eager_tok_s', '{:,.0f}')} | {f('hf_tok_s', '{:,.0f}')} | >= 40,000 |")
print(f"| 1 request x 128, ms/token | {f('ours_ms_per_token_1req', '{:.2f}')} | {f('eager_ms_per_token_1req', '{:.2f}')} | {f('hf_ms_per_token_1req', '{:.2f}')} | <= 1.5 |")
print(f"| GPU busy %, middle half of the 256 run | {f('ours_gpu_busy_pct', '{:.0f}')} | {f('eager_gpu_busy_pct', '{:.0f}')} | | >= 80 |")
if r.get("hf_error"):
    print(f"\nHF transformers could not run: {r['hf_error']}")
PY
  echo
  cat "$out/summary.md"
}

case "$mode" in
  prepare) prepare ;;
  stash) stash ;;
  run) run ;;
  *) echo "usage: $0 [prepare|stash|run]" >&2; exit 2 ;;
esac
