#!/usr/bin/env bash
# A fully static x86_64-unknown-linux-musl release binary, built with every C
# compiler made unusable and linked by rust-lld (no system linker for the
# target), then proved static and free of C-compiling crates.
#
#   bash scripts/static-build.sh            build + proofs
#   bash scripts/static-build.sh --no-proof build only (the Dockerfile's builder uses
#                                           the full run; this is for quick rebuilds)
#
# Environment:
#   CARGO_TARGET_DIR   honoured (default: ./target); the binary ends up in
#                      $CARGO_TARGET_DIR/x86_64-unknown-linux-musl/release/booking-expiration
#   STATIC_LINKER      rust-lld (default) or cc: cc links through the system C
#                      driver, for a toolchain without rust-lld
#   STATIC_BUILD_OUT   if set, the binary is also copied to this path
#   CARGO_BUILD_ARGS   extra `cargo build` arguments (e.g. "--features kafka-zstd"; such
#                      features compile C and so fail here on purpose)
#
# Idempotent: the target is added only when missing, a second run is an
# incremental no-op build plus the proofs. Exit status non-zero on any failed proof.
#
# Note: the *target* binary needs no C toolchain at all; build scripts and proc
# macros are compiled for the host (x86_64-unknown-linux-gnu) and linked by
# rustc's default host linker, which is the system `cc` driver. No crate
# compiles C for either.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=x86_64-unknown-linux-musl
BIN=booking-expiration
PROOF=1
for arg in "$@"; do
  case "$arg" in
    --no-proof) PROOF=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "static-build: unknown argument $arg" >&2; exit 2 ;;
  esac
done

log() { echo "static-build: $*" >&2; }
die() { log "error: $*"; exit 1; }
step() { printf '\n== %s\n' "$*" >&2; }

t0=$(date +%s)

# --- toolchain --------------------------------------------------------------
step "musl target"
if command -v rustup >/dev/null 2>&1; then
  if rustup target list --installed | grep -qx "$TARGET"; then
    log "$TARGET already installed"
  else
    rustup target add "$TARGET"
  fi
else
  log "no rustup: assuming the $TARGET standard library is installed"
fi
sysroot="$(rustc --print sysroot)"
host="$(rustc -vV | sed -n 's/^host: //p')"
[[ -d "$sysroot/lib/rustlib/$TARGET/lib" ]] || die "the $TARGET standard library is missing in $sysroot"

# --- no C compiler ------------------------------------------------------------
# The cc crate reads CC_<target>, TARGET_CC, CC (and the CXX twins); cmake-rs reads
# the same. /bin/false makes any attempt to compile C fail the build loudly.
export CC=/bin/false CXX=/bin/false
export CC_x86_64_unknown_linux_musl=/bin/false CXX_x86_64_unknown_linux_musl=/bin/false
export TARGET_CC=/bin/false TARGET_CXX=/bin/false
export CC_x86_64_unknown_linux_gnu=/bin/false CXX_x86_64_unknown_linux_gnu=/bin/false
export HOST_CC=/bin/false HOST_CXX=/bin/false

# --- linker -------------------------------------------------------------------
# rustc finds rust-lld in $sysroot/lib/rustlib/$host/bin by itself; with the musl
# target's self-contained crt1.o/libc.a/libunwind.a nothing from the system is used.
linker="${STATIC_LINKER:-rust-lld}"
case "$linker" in
  rust-lld)
    if [[ ! -x "$sysroot/lib/rustlib/$host/bin/rust-lld" ]]; then
      log "warning: rust-lld not shipped with this toolchain; falling back to the system cc for linking"
      linker=cc
    fi ;;
  cc) ;;
  *) die "STATIC_LINKER must be rust-lld or cc, not $linker" ;;
esac
if [[ "$linker" == rust-lld ]]; then
  export CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_LINKER=rust-lld
  export CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS="-C link-self-contained=yes -C target-feature=+crt-static"
else
  command -v cc >/dev/null 2>&1 || die "no rust-lld and no system cc to link with"
  export CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_LINKER=cc
  export CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS="-C link-self-contained=yes -C target-feature=+crt-static"
fi
[[ -z "${RUSTFLAGS:-}" ]] || log "warning: RUSTFLAGS is set and overrides the target rustflags: $RUSTFLAGS"

# --- build --------------------------------------------------------------------
step "cargo build --release --target $TARGET (linker: $linker, CC=/bin/false)"
read -r -a extra <<<"${CARGO_BUILD_ARGS:-}"
tb=$(date +%s)
cargo build --release --locked --target "$TARGET" -p "$BIN" --bin "$BIN" "${extra[@]}"
build_s=$(( $(date +%s) - tb ))

target_dir="${CARGO_TARGET_DIR:-target}"
bin_path="$target_dir/$TARGET/release/$BIN"
[[ -x "$bin_path" ]] || die "binary not found at $bin_path"

if [[ -n "${STATIC_BUILD_OUT:-}" ]]; then
  mkdir -p "$(dirname "$STATIC_BUILD_OUT")"
  cp -f "$bin_path" "$STATIC_BUILD_OUT"
fi

if [[ "$PROOF" == 0 ]]; then
  log "built $bin_path in ${build_s}s (proofs skipped)"
  exit 0
fi

# --- proofs -------------------------------------------------------------------
fail=0
ensure_tool() { # TOOL DEBIAN_PACKAGE
  command -v "$1" >/dev/null 2>&1 && return 0
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing $2 for \`$1\`"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >&2
  fi
  command -v "$1" >/dev/null 2>&1 || die "\`$1\` is needed for the proofs (package $2)"
}
ensure_tool file file
ensure_tool readelf binutils

step "file"
file_out="$(file -L "$bin_path")"
echo "$file_out"
if grep -Eq 'statically linked|static-pie linked' <<<"$file_out"; then
  log "ok: file says statically linked"
else
  log "FAIL: file does not say statically linked"; fail=1
fi

step "ldd"
# glibc's ldd says "not a dynamic executable" for a non-PIE static binary and
# "statically linked" for a static-pie one (what rustc builds for musl by default).
ldd_out="$(ldd "$bin_path" 2>&1 || true)"
echo "$ldd_out"
if grep -Eq 'not a dynamic executable|statically linked' <<<"$ldd_out"; then
  log "ok: ldd finds no shared library"
else
  log "FAIL: ldd lists shared libraries"; fail=1
fi

step "ELF: no program interpreter, no NEEDED library"
if readelf -lW "$bin_path" | grep -q 'INTERP'; then
  log "FAIL: the binary asks for a program interpreter"; fail=1
elif readelf -dW "$bin_path" | grep -q '(NEEDED)'; then
  log "FAIL: the binary needs shared libraries:"; readelf -dW "$bin_path" | grep '(NEEDED)' >&2; fail=1
else
  log "ok: no INTERP segment, no NEEDED entry"
fi

step "cargo tree -e normal,build --target $TARGET: no C-compiling crate"
banned='^(cc|cmake|pq-sys|openssl-sys|openssl-src|rdkafka-sys|librdkafka-sys|lz4-sys|zstd-sys|ring|aws-lc-sys|aws-lc-rs|bindgen|libz-sys|libsqlite3-sys) v'
tree="$(cargo tree --locked --workspace -e normal,build --target "$TARGET" --prefix none "${extra[@]}")"
crates="$(sort -u <<<"$tree" | sed 's/ (.*//; s/ (\*)$//' | sort -u)"
if grep -Eq "$banned" <<<"$crates"; then
  log "FAIL: C-compiling crates in the tree:"; grep -E "$banned" <<<"$crates" >&2; fail=1
else
  log "ok: none of cc, cmake, pq-sys, openssl-sys, rdkafka-sys, lz4-sys, zstd-sys, ring ($(wc -l <<<"$crates") crates checked)"
fi

step "size"
bytes=$(stat -c %s "$bin_path")
printf '%s: %d bytes (%s)\n' "$bin_path" "$bytes" "$(numfmt --to=iec-i --suffix=B "$bytes" 2>/dev/null || echo "$(( bytes / 1024 )) KiB")"

step "run: $BIN --version"
if version="$(env -i "$bin_path" --version)"; then
  echo "$version"
else
  log "FAIL: $bin_path --version failed"; fail=1
fi

total_s=$(( $(date +%s) - t0 ))
echo
if [[ "$fail" == 0 ]]; then
  echo "static-build: OK $bin_path ($bytes bytes, linker $linker, build ${build_s}s, total ${total_s}s)"
else
  echo "static-build: FAILED (see above)" >&2
  exit 1
fi
