# The operator image: a static-enough Rust binary on a minimal Debian base, run as non-root.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --profile dist --locked -p mo-operator

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/dist/mo-operator /usr/local/bin/mo-operator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/mo-operator"]
CMD ["run"]
