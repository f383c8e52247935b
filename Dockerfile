# One image holding every executable; compose.yaml picks the process with `command`.
FROM swift:6.3-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libzmq3-dev libsqlite3-dev libvips-dev libjpeg-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Package.swift ./
COPY Shared Shared
COPY Services Services
COPY Benchmarks Benchmarks
COPY Tests Tests
COPY Clients Clients
RUN swift build -c release --static-swift-stdlib \
    && mkdir /out && for p in gateway quota history jobs worker; do cp "$(swift build -c release --show-bin-path)/$p" /out/; done

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends libzmq5 libsqlite3-0 libvips42 ffmpeg ca-certificates tzdata \
    && rm -rf /var/lib/apt/lists/* && useradd --system --home /data app && mkdir /data && chown app /data
COPY --from=build /out/ /usr/local/bin/
COPY openapi.yaml /usr/local/share/photoedit/openapi.yaml
USER app
VOLUME /data
ENV DATA_DIR=/data OPENAPI_FILE=/usr/local/share/photoedit/openapi.yaml
EXPOSE 8080
CMD ["gateway"]
