# The zkgate image: one binary that is the controller, the init container,
# the native sidecar and the command wrapper. Built elsewhere (no Docker
# engine runs on the development machines):
#   docker build -t ghcr.io/zkgate/zkgate:0.2.0 .
# scripts/images builds the same image without Docker (same binary build,
# files, user and entrypoint; tests/e2e.rs compares them) for the local cluster.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY scripts/build-static ./scripts/build-static
# A static executable: `zkgate install` copies it into images that may have
# no glibc (busybox, distroless/static, scratch).
RUN CARGO_TARGET_DIR=/src/target scripts/build-static >/dev/null \
 && cp target/x86_64-unknown-linux-gnu/release/zkgate /zkgate && strip /zkgate

# Distroless static: CA certificates and accounts, no libc, no shell; runs as
# nonroot (65532).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /zkgate /usr/local/bin/zkgate
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/zkgate"]
