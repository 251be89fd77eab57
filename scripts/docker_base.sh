#!/bin/sh
# Make the sandbox's local Docker base image with no registry, then build the sandbox images on it.
#
#   scripts/docker_base.sh            (or `make docker-base`; root, a running daemon, debootstrap)
#
# 1. debootstrap --variant=minbase a Debian bookworm with python3, python3-pytest and git from the
#    Debian mirror apt already uses (first URIs of /etc/apt/sources.list.d/debian.sources or
#    sources.list; override with MIRROR=...), into a temp folder;
# 2. `tar | docker import` it as $BASE_IMAGE (default evotrainer-base:bookworm), then the folder goes;
# 3. build evotrainer-sandbox-{analyzer,code-runner,swe-runner}:latest on it (build arguments
#    BASE=$BASE_IMAGE PIP_REQUIREMENTS=0: nothing is installed from PyPI, so the analyzer image has
#    no numpy / pyarrow / duckdb; the test that needs them skips).
# An image that already exists is kept (REBUILD=1 rebuilds all). The daemon is the one `docker` reaches
# ($DOCKER_HOST). Prints the time and size of each step. Exit status non-zero on the first failure.
set -eu
export DOCKER_BUILDKIT=0  # the legacy builder (docker.io has no buildx); also quiets its deprecation notice
BASE_IMAGE=${BASE_IMAGE:-evotrainer-base:bookworm}
SUITE=${SUITE:-bookworm}
PACKAGES=${PACKAGES:-python3,python3-pytest,git}
REBUILD=${REBUILD:-0}
HERE=$(cd "$(dirname "$0")/.." && pwd)
IMAGES="$HERE/sandbox_images"

if [ -z "${MIRROR:-}" ]; then
  MIRROR=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
  [ -n "$MIRROR" ] || MIRROR=$(sed -n 's/^deb \(\[[^]]*\] \)\{0,1\}\([^ ]*\) .*/\2/p' /etc/apt/sources.list 2>/dev/null | head -n1)
  [ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
fi
command -v docker >/dev/null || { echo "docker (client) not found: apt-get install -y docker.io" >&2; exit 2; }
docker version --format '{{.Server.Version}}' >/dev/null || { echo "no Docker daemon answers (start dockerd)" >&2; exit 2; }

have() { docker image inspect "$1" >/dev/null 2>&1; }
if [ "$REBUILD" = 1 ] || ! have "$BASE_IMAGE"; then
  command -v debootstrap >/dev/null || { echo "debootstrap not found: apt-get install -y debootstrap" >&2; exit 2; }
  [ "$(id -u)" = 0 ] || { echo "debootstrap needs root" >&2; exit 2; }
  ROOT=$(mktemp -d /var/tmp/evotrainer-base.XXXXXX)
  trap 'rm -rf "$ROOT"' EXIT
  t0=$(date +%s)
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 \
    || { tail -20 "$ROOT.log" >&2; rm -f "$ROOT.log"; exit 1; }
  rm -f "$ROOT.log"
  rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
  t1=$(date +%s)
  tar -C "$ROOT" -c . | docker import -m "debootstrap --variant=minbase --include=$PACKAGES $SUITE" - "$BASE_IMAGE" >/dev/null
  t2=$(date +%s)
  echo "base $BASE_IMAGE: debootstrap $((t1 - t0)) s, import $((t2 - t1)) s, $(docker image inspect -f '{{.Size}}' "$BASE_IMAGE") bytes"
fi
for image in analyzer code-runner swe-runner; do
  tag="evotrainer-sandbox-$image:latest"
  if [ "$REBUILD" = 1 ] || ! have "$tag"; then
    t0=$(date +%s)
    docker build -q --network none --build-arg BASE="$BASE_IMAGE" --build-arg PIP_REQUIREMENTS=0 \
      -t "$tag" "$IMAGES/$image" >/dev/null
    echo "$tag: built in $(( $(date +%s) - t0 )) s, $(docker image inspect -f '{{.Size}}' "$tag") bytes"
  fi
done
