# syntax=docker/dockerfile:1
# The prefix-picker and model-sim images (.github/workflows/image.yml is written to build
# linux/amd64 and linux/arm64 and push to GHCR on tags; it has never run):
#
#   docker build -t ghcr.io/prefix-picker/prefix-picker:0.1.0 .        (the last stage: default)
#   docker build --target model-sim -t ghcr.io/prefix-picker/model-sim:0.1.0 .
#
# The tests build it without a daemon: scripts/dockerfile runs buildah on stand-ins for the two
# base images (RUST_IMAGE, RUNTIME_IMAGE: assembled from Debian's packages and the host's Rust,
# since no container registry is reachable where the tests run), and
# tests/integration/deploy/image.rs (dockerfile_*) runs both images' entrypoints as 65532:65532,
# as the chart and the kind recipe run them. The default bases below are not pulled there.
#
# Stage `deps` compiles the locked dependencies alone, against stub sources: its layer survives
# any change under src/ or crates/*/src/ (only the manifests or Cargo.lock invalidate it). Stage
# `build` compiles the sources on top. The runtime stages are distroless (glibc, CA certificates,
# no shell).
ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${RUST_IMAGE} AS deps
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates/model-sim/Cargo.toml crates/model-sim/
COPY crates/prefix-bench/Cargo.toml crates/prefix-bench/
COPY crates/testkit/Cargo.toml crates/testkit/
# Stubs for every target the workspace's manifests name or the build asks for: each crate's
# library and binary, the sidecar's [[test]] and every [[bench]] (cargo refuses a manifest whose
# declared targets have no file; the names are read from Cargo.toml, so a new bench needs no edit).
RUN mkdir -p src benches tests/integration crates/model-sim/src crates/prefix-bench/src crates/testkit/src \
 && touch src/lib.rs crates/model-sim/src/lib.rs crates/prefix-bench/src/lib.rs crates/testkit/src/lib.rs \
 && for main in src crates/model-sim/src crates/prefix-bench/src tests/integration; do echo 'fn main() {}' > "$main/main.rs"; done \
 && for bench in $(sed -n '/^\[\[bench\]\]/{n;s/^name = "\(.*\)"$/\1/p}' Cargo.toml); do echo 'fn main() {}' > "benches/$bench.rs"; done \
 && cargo build --release --locked --workspace --bin prefix-picker --bin model-sim \
 && rm -rf src benches tests crates

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

FROM ${RUNTIME_IMAGE} AS model-sim
LABEL org.opencontainers.image.title=model-sim org.opencontainers.image.licenses=Apache-2.0
COPY --from=build /out/model-sim /model-sim
USER 65532:65532
EXPOSE 8000/tcp
ENTRYPOINT ["/model-sim"]
CMD ["--host=0.0.0.0"]

FROM ${RUNTIME_IMAGE} AS prefix-picker
LABEL org.opencontainers.image.title=prefix-picker org.opencontainers.image.licenses=Apache-2.0
COPY --from=build /out/prefix-picker /prefix-picker
USER 65532:65532
EXPOSE 9002/tcp 9003/tcp 9090/tcp
ENTRYPOINT ["/prefix-picker"]
CMD ["serve", "--config", "/etc/prefix-picker/routerConfiguration"]
