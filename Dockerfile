# syntax=docker/dockerfile:1
# lmserve container image.
#
#   docker build -t lmserve:cuda .                         # CUDA (default): CUDA devel image -> CUDA runtime image
#   docker build -t lmserve:cpu --build-arg VARIANT=cpu .  # CPU only: debian:12-slim -> debian:12-slim
#
# The build steps are the repository's own scripts (scripts/setup.sh, scripts/build.sh), the same
# commands CI runs. The runtime stage gets no packages of its own: the build stage collects the shared
# libraries the binary links (deploy/docker/collect-runtime-libs.sh, by ldd), minus glibc and the CUDA
# libraries that the runtime image and the NVIDIA container runtime provide. So the runtime stage never
# guesses package names (Ubuntu 24.04's t64 names differ from Debian 12's).
#
# At run time the process runs as uid 10001 and writes nothing outside mounted volumes: the root
# filesystem can be read-only (`docker run --read-only --tmpfs /tmp`). The model is mounted read-only at
# /models (or fetched there by an init container: see deploy/kubernetes and docs/deploying.md):
#
#   docker run --read-only --tmpfs /tmp --gpus all -v "$PWD/models:/models:ro" \
#     -p 50051:50051 -p 8000:8000 -p 9400:9400 lmserve:cuda
# serves /models/model.gguf on 0.0.0.0:50051 (gRPC), :8000 (the OpenAI-compatible HTTP API) and
# :9400 (/metrics); arguments after the image
# name replace the default command (`serve --model=... --backend=... --host=... --port=...`).
ARG VARIANT=cuda
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04
ARG CPU_IMAGE=debian:12-slim

# ---- build --------------------------------------------------------------------------------------
FROM ${CUDA_DEVEL_IMAGE} AS build-cuda
ENV LMSERVE_CUDA=ON
FROM ${CPU_IMAGE} AS build-cpu
ENV LMSERVE_CUDA=OFF

# hadolint ignore=DL3006
FROM build-${VARIANT} AS build
# CUDA architectures to compile for (CMake's list syntax): machine code for A100/A30 (80), A10/A40/
# RTX 30xx (86), L4/L40S/RTX 40xx (89) and H100/H200 (90), plus compute_90 PTX that the driver
# compiles for newer GPUs. Below 9.0 the kernels take their portable path (kernels/cuda/device.h).
ARG CUDA_ARCHITECTURES="80-real;86-real;89-real;90-real;90-virtual"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# The setup script alone first, so that the Debian packages are a layer of their own that source
# changes do not rebuild: the build's libraries and headers, libcli11-dev (CLI11, the command-line
# parser, header-only) among them. (`apt-get update` first: a fresh image has no package lists, and
# setup.sh looks packages up before it updates.)
COPY scripts/setup.sh scripts/
RUN apt-get update -qq \
    && scripts/setup.sh \
    && rm -rf /var/lib/apt/lists/*
COPY . .
RUN BUILD_TYPE=Release BUILD_DIR=/build scripts/build.sh \
      -DLMSERVE_CUDA="${LMSERVE_CUDA}" -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
      -DLMSERVE_BUILD_TESTS=OFF \
    && deploy/docker/collect-runtime-libs.sh /out /build/bin/lmserve /build/bin/lmserve-cli

# ---- runtime ------------------------------------------------------------------------------------
# The variant stages differ only in the default command: the server's default backend is the CPU one.
# (ENTRYPOINT and CMD live here, not in the final stage: an ENTRYPOINT there would reset the CMD.)
FROM ${CUDA_RUNTIME_IMAGE} AS runtime-cuda
ENTRYPOINT ["/usr/local/bin/lmserve"]
CMD ["serve", "--model=/models/model.gguf", "--backend=cuda", "--host=0.0.0.0", "--port=50051", "--http-port=8000", "--metrics-port=9400"]

FROM ${CPU_IMAGE} AS runtime-cpu
ENTRYPOINT ["/usr/local/bin/lmserve"]
CMD ["serve", "--model=/models/model.gguf", "--backend=cpu", "--host=0.0.0.0", "--port=50051", "--http-port=8000", "--metrics-port=9400"]

# hadolint ignore=DL3006
FROM runtime-${VARIANT}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# /out holds usr/local/bin/{lmserve,lmserve-cli}, usr/local/lib/lmserve/*.so* and
# etc/ld.so.conf.d/lmserve.conf.
COPY --from=build /out/ /
# Every library resolves (but the driver's libcuda, which the NVIDIA container runtime mounts).
RUN ldconfig \
    && ! ldd /usr/local/bin/lmserve /usr/local/bin/lmserve-cli | grep -v 'libcuda\.so' | grep 'not found' \
    && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin lmserve \
    && mkdir -p /models
# Nothing in the image is written at run time. HOME and the CUDA JIT cache point at /tmp, which is a
# mounted tmpfs or emptyDir where the root filesystem is read-only.
ENV HOME=/tmp \
    CUDA_CACHE_PATH=/tmp/cuda-cache
USER 10001:10001
WORKDIR /tmp
VOLUME ["/models"]
# gRPC (lmserve.v1, grpc.health.v1, reflection), the OpenAI-compatible HTTP API and Prometheus
# /metrics.
EXPOSE 50051 8000 9400
# The gRPC health protocol (grpc.health.v1.Health/Check) through lmserve-cli, the project's own client
# (exit 0 when SERVING; the server says SERVING once the model is loaded and warmed up). The start
# period covers that; Kubernetes uses its native grpc probes instead.
HEALTHCHECK --start-period=600s --interval=30s --timeout=10s --retries=3 \
  CMD ["/usr/local/bin/lmserve-cli", "health", "--addr", "127.0.0.1:50051"]
