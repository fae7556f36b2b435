# syntax=docker/dockerfile:1
#
# booking-expiration as a static musl binary in an empty image.
#
#   docker build -t booking-expiration .
#   docker run --rm booking-expiration --version
#
# The builder runs scripts/static-build.sh, the same command as on a developer
# machine and in CI: every C compiler is /bin/false, the binary is linked by
# rust-lld with musl's self-contained crt, and the script proves it static
# (file, ldd, readelf) and free of C-compiling crates (cargo tree) before the
# binary is copied into `scratch`. No CA certificates are needed (the default
# build has no TLS), nor a libc, a shell or a passwd file (numeric USER).

ARG RUST_IMAGE=rust:1.95-slim

FROM ${RUST_IMAGE} AS builder
# `file` is for the proofs; gcc (host linker of build scripts) and binutils
# (readelf) come with the rust image. Not version-pinned: any `file` will do.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends file \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The toolchain pinned by rust-toolchain.toml plus the musl standard library,
# in a layer of its own so source changes do not repeat it.
COPY rust-toolchain.toml ./
RUN rustup toolchain install && rustup target add x86_64-unknown-linux-musl
COPY . .
ENV CARGO_TARGET_DIR=/build/target CARGO_TERM_COLOR=never
RUN --mount=type=cache,id=booking-expiration-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=booking-expiration-target,target=/build/target \
    STATIC_BUILD_OUT=/out/booking-expiration bash scripts/static-build.sh

FROM scratch
LABEL org.opencontainers.image.title="booking-expiration" \
      org.opencontainers.image.description="Expires overdue bookings and publishes BookingExpiredEvent to Kafka through a transactional outbox" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/booking-expiration /booking-expiration
USER 65532:65532
EXPOSE 9464
ENV METRICS_ADDR=0.0.0.0:9464
ENTRYPOINT ["/booking-expiration"]
CMD ["run"]
