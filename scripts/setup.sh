#!/usr/bin/env bash
# Installs every Debian package ptrain needs (when one is missing) and builds
# Release into build/. Safe to re-run: installed packages are skipped and the
# build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libopenmpi-dev openmpi-bin
  prometheus-cpp-dev libspdlog-dev libyaml-cpp-dev libsqlite3-dev libcli11-dev
  nlohmann-json3-dev libxxhash-dev
  libdnnl-dev libopenblas-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-numpy python3-torch
  prometheus
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) != 0 ]]; then SUDO=sudo; fi
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${PT_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"
