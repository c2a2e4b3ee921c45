#!/usr/bin/env bash
# Installs the Debian packages ptrain needs (only those missing) and builds
# Release into build/. Safe to re-run: installed packages are skipped and the
# build is incremental.
#
#   scripts/setup.sh           what building and running ptrain needs
#   scripts/setup.sh --tests   also what the tests and benchmarks need
#                              (GoogleTest, PyTorch for the reference model,
#                              a Prometheus server), and builds them
#
# Every package is named: nothing is left to apt's recommendations, so a
# minimal Debian 12 (debootstrap --variant=minbase) gets everything it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

tests=0
for arg in "$@"; do
  case $arg in
    --tests) tests=1 ;;
    *) echo "setup: unknown argument '$arg' (use --tests or nothing)" >&2; exit 2 ;;
  esac
done

# Building and running: compiler and build tools, gRPC + protobuf, OpenMPI,
# the libraries, and oneDNN with the OpenCL headers its CMake config requires
# (libdnnl-dev only recommends them); OpenSSL's libcrypto for digests;
# ICU for the char tokenizer's UTF-8 and the character classes of GPT-2's
# pre-tokenizer; SentencePiece; RE2 (GPT-2's pattern, which the fuzz target
# holds the pre-tokenizer to); PCRE2 (the patterns of Hugging Face
# tokenizer.json files, which need lookahead); cpp-httplib serves ptcoord's web UI, and
# Chart.js draws its charts; zstd and zlib decompress corpora for prepare,
# simdjson reads their JSON lines.
# python3 prints the demo's sample.
PACKAGES=(
  build-essential cmake pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev libre2-dev libpcre2-dev libsentencepiece-dev
  libopenmpi-dev openmpi-bin
  prometheus-cpp-dev libspdlog-dev libyaml-cpp-dev libsqlite3-dev libcli11-dev
  nlohmann-json3-dev libxxhash-dev libicu-dev
  libdnnl-dev ocl-icd-opencl-dev libopenblas-dev
  libssl-dev libzstd-dev zlib1g-dev libsimdjson-dev
  libcpp-httplib-dev libjs-chart.js
  python3
)
# Only for tests and benchmarks: GoogleTest; PyTorch computes the reference
# model during the test run; a real Prometheus scrapes ranks in integration
# tests; clang with its sanitizer and libFuzzer runtimes and OpenMP builds
# the fuzz targets (scripts/fuzz.sh); openssl makes test certificates;
# iproute2, util-linux and procps make the multinode tests' pretend nodes,
# whose job events sqlite3 reads; Slurm's daemons and munge run the slurm
# tests; systemd's systemd-analyze checks deploy/systemd's units; the
# cluster dashboard's test reads deploy/prometheus.yml with python3-yaml;
# headless Chromium loads the web UI, driven by python3-websocket, its
# screenshots read by python3-pil.
TEST_PACKAGES=(
  libgtest-dev
  python3-numpy python3-torch python3-yaml
  prometheus systemd
  clang libclang-rt-14-dev libomp-14-dev
  openssl
  iproute2 util-linux procps sqlite3
  slurmctld slurmd slurm-client munge
  chromium python3-websocket python3-pil
)
if ((tests)); then PACKAGES+=("${TEST_PACKAGES[@]}"); fi

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
packages_s=$((SECONDS - start))

# Tests and benchmarks are built only when asked for (they need GoogleTest);
# a later plain run keeps whatever the build folder was configured with.
cmake_args=(-DCMAKE_BUILD_TYPE=Release)
if ((tests)); then cmake_args+=(-DPT_BUILD_TESTS=ON -DPT_BUILD_BENCH=ON); fi
# shellcheck disable=SC2086  # PT_CMAKE_ARGS is a list of words by design
cmake -S . -B build "${cmake_args[@]}" ${PT_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"
echo "setup: done in $((SECONDS - start)) s (packages ${packages_s} s, build $((SECONDS - start - packages_s)) s)"
