# The zkgate image: one binary that is the controller, the init container,
# the native sidecar and the command wrapper. Built elsewhere (no Docker
# engine runs on the development machines):
#   docker build -t ghcr.io/zkgate/zkgate:0.1.0 .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
RUN cargo build --release --locked --bin zkgate && strip target/release/zkgate

# Distroless: glibc and CA certificates, no shell, runs as nobody (65532).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/zkgate /usr/local/bin/zkgate
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/zkgate"]
