# syntax=docker/dockerfile:1
#
# sluice container image: a release build on Debian bookworm, run as a non-root user
# in a distroless image (glibc, libgcc, CA certificates; no shell, no package manager).
#
#   docker build -t sluice:dev .
#   docker run --rm -p 8081:8081 -p 8080:8080 \
#     -v "$PWD/my-rules:/etc/sluice/rules:ro" sluice:dev
#
# Dependencies are compiled in their own layer (cargo-chef), so a change to the
# sources rebuilds only sluice itself.

ARG RUST_VERSION=1.95

# --- chef: the toolchain plus cargo-chef -------------------------------------------
FROM rust:${RUST_VERSION}-bookworm AS chef
RUN cargo install cargo-chef --locked --version ^0.1
WORKDIR /src

# --- planner: a recipe of the dependency graph (changes only with Cargo.toml/.lock) --
FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

# --- builder: dependencies first (cached), then sluice ------------------------------
FROM chef AS builder
COPY --from=planner /src/recipe.json recipe.json
RUN cargo chef cook --release --locked --recipe-path recipe.json
COPY . .
# The commit `sluice --version` and `sluice_build_info` name (.git is not in the context):
# docker build --build-arg SLUICE_COMMIT=$(git rev-parse --short=12 HEAD) ...
ARG SLUICE_COMMIT=unknown
ENV SLUICE_COMMIT=${SLUICE_COMMIT}
# /bin/ratelimit too: envoyproxy/ratelimit's image runs as that, and manifests written for it
# (Envoy Gateway's, Istio's samples) set `command: ["/bin/ratelimit"]`; sluice run by that
# name with no subcommand serves, configured by the reference's variables.
RUN cargo build --release --locked --bin sluice \
    && install -D -m 0755 target/release/sluice /out/root/usr/local/bin/sluice \
    && mkdir -p /out/root/bin && ln -s /usr/local/bin/sluice /out/root/bin/ratelimit

# --- runtime ------------------------------------------------------------------------
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="Envoy RLS v3 rate-limit service, a drop-in replacement for envoyproxy/ratelimit" \
      org.opencontainers.image.licenses="Apache-2.0"
# A directory copy keeps the symlink.
COPY --from=builder /out/root/ /
# The example rules, so `docker run sluice` serves something; mount your own over it. Named
# by CMD, not by SLUICE_CONFIG: a variable in the image would win over the RUNTIME_ROOT of
# an environment written for the reference.
COPY config/rules /etc/sluice/rules
# The nonroot user of the distroless image (uid/gid 65532), matching the Helm chart.
# sluice writes nothing to disk, so a read-only root filesystem works.
USER 65532:65532
# gRPC (RLS, grpc.health.v1, reflection) and HTTP (/livez, /readyz, /metrics, ...).
EXPOSE 8081 8080
# On SIGTERM sluice turns not-ready, drains and flushes within SHUTDOWN_GRACE (20s).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve", "--config", "/etc/sluice/rules"]
