#!/usr/bin/env bash
# The test command (README line 2; .ci/run calls it). Fetches the real test weights, checks
# formatting and lints, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-test-models.sh
export VRAMLAB_MODELS=${VRAMLAB_MODELS:-$PWD/.cache/models}
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
