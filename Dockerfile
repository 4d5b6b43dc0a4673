# syntax=docker/dockerfile:1
# lmserve container image. The build steps are the repository's own scripts, so CI exercises the
# same commands. A CUDA image is the default; `--build-arg VARIANT=cpu` builds a CPU-only image on
# Debian slim.
ARG VARIANT=cuda
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04
ARG CPU_IMAGE=debian:12-slim

FROM ${CUDA_DEVEL_IMAGE} AS build-cuda
FROM ${CPU_IMAGE} AS build-cpu

# hadolint ignore=DL3006
FROM build-${VARIANT} AS build
ARG VARIANT
WORKDIR /src
COPY . .
RUN scripts/setup.sh \
    && if [ "${VARIANT}" = "cpu" ]; then cuda=OFF; else cuda=ON; fi \
    && BUILD_TYPE=Release scripts/build.sh -DLMSERVE_CUDA="${cuda}" -DLMSERVE_BUILD_TESTS=OFF \
    && mkdir -p /out/bin && cp build/bin/lmserve /out/bin/

FROM ${CUDA_RUNTIME_IMAGE} AS runtime-cuda
FROM ${CPU_IMAGE} AS runtime-cpu

# hadolint ignore=DL3006
FROM runtime-${VARIANT}
# Runtime libraries only (the -dev packages pull them in at build time).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libopenblas0 libpcre2-8-0 \
       libabsl20220623 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home lmserve
COPY --from=build /out/bin/lmserve /usr/local/bin/lmserve
USER 10001
# The model is mounted at /models (read-only); nothing is written outside mounted volumes.
VOLUME ["/models"]
ENTRYPOINT ["/usr/local/bin/lmserve"]
CMD ["info", "--model", "/models/model.gguf"]
