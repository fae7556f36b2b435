#!/usr/bin/env bash
# `cargo deny check advisories` against a snapshot of the RustSec advisory
# database, offline: nothing is fetched from GitHub. A crate with an advisory
# fails the check unless deny.toml ignores it with a reason.
#
#   scripts/check-advisories.sh
#
#   ADVISORY_DB   the snapshot: a plain copy of github.com/rustsec/advisory-db's
#                 tree with a SNAPSHOT file naming its commit and date
#                 (default /work/shared/advisory-db, this machine's; CI clones
#                 the repository elsewhere, so the default is absolute).
#                 Missing: the check FAILS (it is never skipped silently).
#   CARGO_DENY    the cargo-deny binary (default: the one .ci/run installs,
#                 /var/cache/booking-expiration/tools/bin/cargo-deny, else PATH)
#
# cargo-deny opens a database only as a git repository (it reads HEAD's time
# to judge staleness), so the snapshot is copied into a temporary repository
# whose one commit carries the snapshot's date: `maximum-db-staleness` in
# deny.toml then measures the snapshot's real age. The dependency graph comes
# from `cargo metadata` (which may download crates from crates.io, as the other
# cargo-deny checks do); `--offline` then keeps cargo-deny itself from fetching.
#
# Before the real check, a negative control: the same run against a copy of the
# snapshot with one made-up advisory for a crate of this workspace's graph
# must fail, or the check could not fail at all.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "check-advisories: $*" >&2; }
die() {
  log "$*"
  exit 1
}

db="${ADVISORY_DB:-/work/shared/advisory-db}"
deny="${CARGO_DENY:-/var/cache/booking-expiration/tools/bin/cargo-deny}"
[[ -x "$deny" ]] || deny="$(command -v cargo-deny || true)"
[[ -n "$deny" && -x "$deny" ]] || die "cargo-deny not found (set CARGO_DENY; .ci/run installs it)"
[[ -f "$db/SNAPSHOT" && -d "$db/crates" ]] ||
  die "no RustSec advisory database at $db (set ADVISORY_DB to a copy of github.com/rustsec/advisory-db with a SNAPSHOT file)"

# "commit <sha>, committed YYYY-MM-DD." in SNAPSHOT.
snapshot_date="$(grep -oE 'committed [0-9]{4}-[0-9]{2}-[0-9]{2}' "$db/SNAPSHOT" | head -n1 | cut -d' ' -f2)"
[[ -n "$snapshot_date" ]] || die "$db/SNAPSHOT names no 'committed YYYY-MM-DD' date"
snapshot_commit="$(grep -oE 'commit [0-9a-f]{40}' "$db/SNAPSHOT" | head -n1 | cut -d' ' -f2)"
age_days=$((($(date -u +%s) - $(date -u -d "$snapshot_date" +%s)) / 86400))
log "RustSec snapshot ${snapshot_commit:-?} of $snapshot_date ($age_days days old) from $db"

work="$(mktemp -d "${TMPDIR:-/tmp}/check-advisories.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# cargo-deny's own name for the database directory of deny.toml's db-urls,
# asked of cargo-deny (it hashes the URL), so nothing here guesses it.
metadata="$work/metadata.json"
cargo metadata --format-version 1 --locked --all-features >"$metadata"
run_deny() { # ROOT [cargo-deny check arguments]
  local root="$1"
  shift
  BOOKING_EXPIRATION_ADVISORY_DB_ROOT="$root" "$deny" --offline --metadata-path "$metadata" \
    --color never "$@"
}
probe="$(run_deny "$work/probe" --log-level debug check advisories 2>&1 || true)"
dir_name="$(sed -n "s|.*Opening advisory database at '$work/probe/\([^']*\)'.*|\1|p" <<<"$probe" | head -n1)"
[[ -n "$dir_name" ]] || die "cannot tell where cargo-deny looks for the database"

# ROOT/DIR: the snapshot (plus extra files) as a one-commit git repository
# dated like the snapshot.
make_repo() { # ROOT
  local repo="$1/$dir_name"
  mkdir -p "$repo"
  cp -a "$db/." "$repo/"
  (
    cd "$repo"
    git init -q
    git add -A
    GIT_AUTHOR_DATE="${snapshot_date}T00:00:00Z" GIT_COMMITTER_DATE="${snapshot_date}T00:00:00Z" \
      git -c user.name=advisory-snapshot -c user.email=advisory-snapshot@localhost \
      commit -q -m "RustSec advisory-db ${snapshot_commit:-snapshot} ($snapshot_date)"
    # cargo-deny takes the later of HEAD's commit time and the HEAD file's
    # time; the file's is set back too, so staleness is the snapshot's.
    touch -d "${snapshot_date}T00:00:00Z" .git/HEAD
  )
}

# Negative control: a made-up advisory for `fastrand` (a direct dependency,
# every version affected) must fail the check. (Not RUSTSEC-0000-0000: the
# rustsec loader skips that id, the placeholder of its advisory template.)
make_repo "$work/control"
mkdir -p "$work/control/$dir_name/crates/fastrand"
cat >"$work/control/$dir_name/crates/fastrand/RUSTSEC-2026-9999.md" <<'EOF'
```toml
[advisory]
id = "RUSTSEC-2026-9999"
package = "fastrand"
date = "2026-01-01"
url = "https://example.invalid/negative-control"

[versions]
patched = []
```

# Negative control of scripts/check-advisories.sh (not a real advisory)
EOF
(cd "$work/control/$dir_name" && git add -A &&
  GIT_AUTHOR_DATE="${snapshot_date}T00:00:00Z" GIT_COMMITTER_DATE="${snapshot_date}T00:00:00Z" \
    git -c user.name=x -c user.email=x@localhost commit -q -m control &&
  touch -d "${snapshot_date}T00:00:00Z" .git/HEAD)
if control="$(run_deny "$work/control" check advisories 2>&1)"; then
  printf '%s\n' "$control" >&2
  die "the negative control passed: a crate with an advisory would not fail CI"
fi
grep -q "RUSTSEC-2026-9999" <<<"$control" ||
  die "the negative control failed for another reason: $control"
log "negative control: an advisory for fastrand fails the check, as it must"

make_repo "$work/db"
run_deny "$work/db" check advisories
log "no advisory for any crate of the graph (or each is ignored in deny.toml with a reason)"
