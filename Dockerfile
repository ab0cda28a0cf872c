# Image with the pullman binary (serve, executor, worker, crdgen). Build: docker build -t pullman .
# Its file system is what config/image/rootfs.sh makes of the binary (the binary, the libraries it
# links, the CA bundle, user 65532); the test node's image (e2e/testenv/images.sh) is made by the
# same script and takes USER and ENTRYPOINT from this file.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin pullman \
    && config/image/rootfs.sh target/release/pullman /rootfs

FROM scratch
COPY --from=build /rootfs /
USER 65532
ENTRYPOINT ["/usr/local/bin/pullman"]
