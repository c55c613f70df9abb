# syntax=docker/dockerfile:1

# Builds the crdbwork demo binary (./cmd/demo) and the operator command
# (./cmd/crdbwork) into a small static image. The entrypoint is the demo;
# /crdbwork is beside it.
#
#   docker build -t crdbwork-demo .
#   docker run --rm -e DATABASE_URL=postgresql://root@host:26257/crdbwork?sslmode=disable crdbwork-demo work --queue demo
#   docker run --rm -e DATABASE_URL=... --entrypoint /crdbwork crdbwork-demo status
#
# docker-compose.yml in this directory runs it against a 3-node CockroachDB
# cluster. The golang tag follows go.mod's `go` line (major.minor); the image
# sets GOTOOLCHAIN=local, so its Go must be at least go.mod's patch version,
# which the floating 1.25 tag is.

FROM golang:1.25 AS build
WORKDIR /src

# Module downloads get their own layer: it is rebuilt only when go.mod or
# go.sum changes, not on every source edit.
COPY go.mod go.sum ./
RUN go mod download && go mod verify

COPY . .
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -o /out/demo ./cmd/demo && \
    CGO_ENABLED=0 go build -trimpath -o /out/crdbwork ./cmd/crdbwork

# distroless/static: CA certificates, tzdata and a nonroot user, no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/demo /demo
COPY --from=build /out/crdbwork /crdbwork
USER nonroot:nonroot
ENTRYPOINT ["/demo"]
CMD ["work"]
