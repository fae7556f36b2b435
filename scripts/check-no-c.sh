#!/usr/bin/env bash
# Fails when the default build pulls a crate that compiles C or links a C
# library (the static binary must build without a C toolchain).
set -euo pipefail
cd "$(dirname "$0")/.."
banned='^(cc|cmake|pq-sys|openssl-sys|rdkafka-sys|librdkafka-sys|lz4-sys|zstd-sys|ring|aws-lc-sys|bindgen|libz-sys) v'
tree="$(cargo tree --workspace -e normal,build --prefix none --locked)"
if grep -Eq "$banned" <<<"$tree"; then
  echo "check-no-c: the default build pulls crates that compile C:" >&2
  grep -E "$banned" <<<"$tree" | sort -u >&2
  exit 1
fi
echo "check-no-c: no C-compiling crate in the default build ($(sort -u <<<"$tree" | wc -l) crates checked)"
