# syntax=docker/dockerfile:1
# The prefix-picker and model-sim images, for builders with a Docker daemon or BuildKit
# (.github/workflows/image.yml is written to build linux/amd64 and linux/arm64 and push to GHCR
# on tags; it has never run):
#
#   docker build -t ghcr.io/prefix-picker/prefix-picker:0.1.0 .        (the last stage: default)
#   docker build --target model-sim -t ghcr.io/prefix-picker/model-sim:0.1.0 .
#
# Nothing has built this file yet: the tests run where there is no Docker daemon or base image.
# Without a daemon, scripts/image builds images with the same entrypoint, user, ports and command
# from the host's cargo (FROM scratch plus the host's glibc); tests/integration/deploy/image.rs
# builds and runs those, and checks that this file's runtime stages declare the same
# (check_dockerfile_stage).
#
# Stage `deps` compiles the locked dependencies alone, against stub sources: its layer survives
# any change under src/ or crates/*/src/ (only the manifests or Cargo.lock invalidate it). Stage
# `build` compiles the sources on top. The runtime stages are distroless (glibc, CA certificates,
# no shell).
FROM rust:1.95-bookworm AS deps
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates/model-sim/Cargo.toml crates/model-sim/
COPY crates/prefix-bench/Cargo.toml crates/prefix-bench/
COPY crates/testkit/Cargo.toml crates/testkit/
# Stubs for every target the workspace's manifests name or the build asks for: each crate's
# library and binary and the sidecar's [[bench]].
RUN mkdir -p src benches crates/model-sim/src crates/prefix-bench/src crates/testkit/src \
 && touch src/lib.rs crates/model-sim/src/lib.rs crates/prefix-bench/src/lib.rs crates/testkit/src/lib.rs \
 && for main in src crates/model-sim/src crates/prefix-bench/src; do echo 'fn main() {}' > "$main/main.rs"; done \
 && echo 'fn main() {}' > benches/core.rs \
 && cargo build --release --locked --workspace --bin prefix-picker --bin model-sim \
 && rm -rf src benches crates

FROM deps AS build
# The git revision for prefix_picker_build_info (the build context has no .git; build.rs reads it).
ARG PREFIX_PICKER_REVISION=unknown
COPY . .
# COPY keeps the files' modification times, which may be older than the stubs' build: touch the
# sources so cargo compiles them instead of reusing the stub crates.
RUN find src benches crates -type f -exec touch {} + \
 && cargo build --release --locked --workspace --bin prefix-picker --bin model-sim \
 && mkdir /out \
 && cp target/release/prefix-picker target/release/model-sim /out/ \
 && strip /out/prefix-picker /out/model-sim

FROM gcr.io/distroless/cc-debian12:nonroot AS model-sim
LABEL org.opencontainers.image.title=model-sim org.opencontainers.image.licenses=Apache-2.0
COPY --from=build /out/model-sim /model-sim
USER 65532:65532
EXPOSE 8000/tcp
ENTRYPOINT ["/model-sim"]
CMD ["--host=0.0.0.0"]

FROM gcr.io/distroless/cc-debian12:nonroot AS prefix-picker
LABEL org.opencontainers.image.title=prefix-picker org.opencontainers.image.licenses=Apache-2.0
COPY --from=build /out/prefix-picker /prefix-picker
USER 65532:65532
EXPOSE 9002/tcp 9003/tcp 9090/tcp
ENTRYPOINT ["/prefix-picker"]
CMD ["serve", "--config", "/etc/prefix-picker/routerConfiguration"]
