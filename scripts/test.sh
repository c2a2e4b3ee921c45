#!/usr/bin/env bash
# The test command (README, CI): sets up and builds when needed, then runs
# every ctest label that can run without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd build
# Tests run one at a time: each already uses every core through OpenMP.
ctest --output-on-failure --label-exclude gpu "$@"
