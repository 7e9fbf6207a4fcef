# prefix-picker image: `docker build -t prefix-picker:0.1.0 .` (the chart's default image).
# Stage 1 builds the release binary with the locked dependencies; stage 2 is a distroless
# runtime (glibc, CA certificates, no shell) running as the unprivileged user 65532.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin prefix-picker \
 && cp target/release/prefix-picker /prefix-picker

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /prefix-picker /usr/local/bin/prefix-picker
USER 65532:65532
EXPOSE 9002 9090
ENTRYPOINT ["/usr/local/bin/prefix-picker"]
CMD ["serve", "--config", "/etc/prefix-picker/routerConfiguration"]
