# The zkgate image: one binary that is the controller, the init container,
# the native sidecar and the command wrapper. Built elsewhere (no Docker
# engine runs on the development machines), for the architecture asked:
#   docker buildx build --platform linux/amd64,linux/arm64 -t ghcr.io/zkgate/zkgate:0.2.0 .
# The build stage runs on the builder's own platform and cross-builds for
# arm64 as scripts/dist does (no emulated compiler). scripts/images builds
# the same image without Docker (same binary build, files, user and
# entrypoint; tests/e2e.rs compares them) for the local cluster, and
# scripts/dist both architectures as one image index.
FROM --platform=$BUILDPLATFORM rust:1.95-bookworm AS build
ARG TARGETARCH
WORKDIR /src
RUN case "$TARGETARCH" in \
      amd64) ;; \
      arm64) apt-get update && apt-get install -y --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross binutils-aarch64-linux-gnu && rm -rf /var/lib/apt/lists/* ;; \
      *) echo "unsupported architecture: $TARGETARCH (amd64 or arm64)" >&2; exit 1 ;; \
    esac
COPY Cargo.toml Cargo.lock ./
# The workspace names the benchmarks' package: its manifest must be there.
COPY bench/Cargo.toml ./bench/Cargo.toml
COPY src ./src
COPY scripts/build-static ./scripts/build-static
# A static executable: `zkgate install` copies it into images that may have
# no glibc (busybox, distroless/static, scratch).
RUN case "$TARGETARCH" in \
      amd64) target=x86_64-unknown-linux-gnu strip=strip ;; \
      arm64) target=aarch64-unknown-linux-gnu strip=aarch64-linux-gnu-strip ;; \
    esac \
 && bin=$(CARGO_TARGET_DIR=/src/target scripts/build-static "$target") \
 && cp "$bin" /zkgate && "$strip" /zkgate

# Distroless static: CA certificates and accounts, no libc, no shell; runs as
# nonroot (65532).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /zkgate /usr/local/bin/zkgate
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/zkgate"]
