# Image with the pullman binary (serve, executor, worker, crdgen). Build: docker build -t pullman .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin pullman

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* && useradd --uid 65532 --no-create-home pullman
COPY --from=build /src/target/release/pullman /usr/local/bin/pullman
USER 65532
ENTRYPOINT ["/usr/local/bin/pullman"]
