# statecast: one static binary on a minimal, non-root image.
#
#   docker build -t statecast .
#   # with JWT auth (the production default: anonymous access is refused off loopback)
#   docker run -p 8080:8080 -v statecast-data:/data \
#     -v "$PWD/jwt.secret:/run/secrets/jwt:ro" -e STATECAST_JWT_HMAC_SECRET_FILE=/run/secrets/jwt statecast
#   # to try it: anonymous clients with full rights
#   docker run -p 8080:8080 -v statecast-data:/data statecast serve --insecure-no-auth
#
# Every serve flag is also an environment variable (STATECAST_ + the flag name).

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/statecast ./cmd/statecast
# The data directory, owned by the runtime user, so a new named volume is writable.
RUN mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/statecast /usr/local/bin/statecast
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
ENV STATECAST_ADDR=0.0.0.0:8080 STATECAST_DATA=/data
VOLUME /data
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=5s --retries=3 CMD ["/usr/local/bin/statecast", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/statecast"]
CMD ["serve"]
