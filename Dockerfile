# Baton's container image for people who build with Docker:
#
#   docker build -t ghcr.io/baton-dev/baton:0.1.0 .
#
# The same image as scripts/build-image (which needs no Docker daemon):
# a static musl `baton` on an empty base, with Debian's CA bundle and a
# non-root user 65532. The labels follow the OCI annotation keys; pass
# --build-arg REVISION=$(git rev-parse HEAD) to stamp the commit.

FROM docker.io/library/rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# rust-toolchain.toml lists the musl and wasm32 targets; rustup installs them.
RUN rustup show active-toolchain \
 && rustup target add x86_64-unknown-linux-musl wasm32-unknown-unknown \
 && cargo build --profile image --locked --target x86_64-unknown-linux-musl -p baton \
 && mkdir -p /out/etc/ssl/certs /out/usr/local/bin /out/home/nonroot /out/tmp \
 && cp target/x86_64-unknown-linux-musl/image/baton /out/usr/local/bin/baton \
 && cp /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ \
 && printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > /out/etc/passwd \
 && printf 'root:x:0:\nnonroot:x:65532:\n' > /out/etc/group \
 && chown 65532:65532 /out/home/nonroot \
 && chmod 1777 /out/tmp

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
COPY --from=build /out/ /
LABEL org.opencontainers.image.title="baton" \
      org.opencontainers.image.description="Baton: operator, sidecar, dashboard and reference agent for stateful AI agents on Kubernetes" \
      org.opencontainers.image.source="https://github.com/baton-dev/baton" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/usr/local/bin HOME=/home/nonroot SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
WORKDIR /home/nonroot
ENTRYPOINT ["/usr/local/bin/baton"]
CMD ["--help"]
