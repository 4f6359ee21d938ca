#!/usr/bin/env bash
# Build the worker or the training image from this checkout.
#
#   docker/build.sh worker|training TAG [docker build options...]
#
# The build context is a temporary folder with the Dockerfile and wheels/: the provider wheel built from this
# checkout, plus the wheels in $EXTRA_WHEELS (a folder, e.g. a local torch wheel). Options go to `docker build`,
# e.g. --build-arg BASE_IMAGE=airflow-gpu-base:bookworm. $PYTHON (default python3) builds the wheel.
set -euo pipefail
kind="${1:?usage: docker/build.sh worker|training TAG [docker build options...]}"
tag="${2:?usage: docker/build.sh worker|training TAG [docker build options...]}"
shift 2
repo="$(cd "$(dirname "$0")/.." && pwd)"
[ -f "$repo/docker/$kind/Dockerfile" ] || { echo "unknown image kind: $kind (worker or training)" >&2; exit 2; }
context="$(mktemp -d /tmp/airflow-gpu-build.XXXXXX)"
trap 'rm -rf "$context"' EXIT
mkdir "$context/wheels"
cp "$repo/docker/$kind/Dockerfile" "$context/"
"${PYTHON:-python3}" -m pip wheel --quiet --no-deps --wheel-dir "$context/wheels" "$repo"
if [ -n "${EXTRA_WHEELS:-}" ]; then
  cp "$EXTRA_WHEELS"/*.whl "$context/wheels/"
fi
docker build --force-rm -t "$tag" "$@" "$context"
