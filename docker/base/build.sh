#!/usr/bin/env bash
# Build a local Python base image from Debian packages (no registry pull is needed or possible here).
#
#   docker/base/build.sh [IMAGE]      default IMAGE: airflow-gpu-base:bookworm
#
# The host's CA bundle is copied in, so pip/uv inside containers work behind a TLS-intercepting proxy.
set -euo pipefail
image="${1:-airflow-gpu-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "base image $image exists"
  exit 0
fi
root="$(mktemp -d /tmp/airflow-gpu-base.XXXXXX)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates bookworm "$root" "$mirror"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
  -c 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
  -c 'CMD ["python3"]' \
  - "$image"
echo "built base image $image"
