#!/usr/bin/env bash
# Schema guard of the contract in proto/ with buf (pinned version, installed from the npm
# registry's @bufbuild/buf into a cache folder; nothing installed by hand but node/npm).
#
#   scripts/buf.sh install     install buf (once) and print its path
#   scripts/buf.sh lint        buf lint proto (proto/buf.yaml: buf's default STANDARD rules)
#   scripts/buf.sh breaking    buf breaking proto --against '<repo>/.git#ref=<commit>,subdir=proto'
#                              for EVERY earlier commit of the current branch that changed
#                              proto/ (each distinct version once), so a breaking change made in
#                              any commit of a multi-commit submission fails; passes, saying so,
#                              when there is no earlier version
#   scripts/buf.sh check       lint, then breaking
#   scripts/buf.sh buf ARGS... run the pinned buf with ARGS (e.g. buf format -d proto)
#
# Environment: BUF_VERSION (default 1.75.0), BUF_CACHE_DIR (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/booking-expiration/buf), NPM (default npm),
# BUF_BREAKING_SINCE=REF compares only against REF's proto/ and the versions committed after REF
# (an escape hatch, for a reviewed deliberate break: REF becomes the new baseline).
# Needs git, node and npm (only for the first install).
set -euo pipefail

BUF_VERSION="${BUF_VERSION:-1.75.0}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CACHE="${BUF_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/booking-expiration/buf}"
PREFIX="$CACHE/$BUF_VERSION"
read -r -a NPM <<<"${NPM:-npm}"

log() { echo "buf.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

find_bin() { # the native binary of the platform package, else npm's node wrapper
  local b
  for b in "$PREFIX"/node_modules/@bufbuild/buf-*/bin/buf "$PREFIX"/node_modules/@bufbuild/buf-*/bin/buf.exe \
           "$PREFIX/node_modules/.bin/buf"; do
    if [[ -x "$b" ]]; then
      echo "$b"
      return 0
    fi
  done
  return 1
}

installed() {
  [[ -f "$PREFIX/.complete" ]] && BUF="$(find_bin)" && [[ "$("$BUF" --version 2>/dev/null)" == "$BUF_VERSION" ]]
}

cmd_install() {
  installed && return 0
  command -v "${NPM[0]}" >/dev/null 2>&1 || die "npm not found: it is needed once to install @bufbuild/buf@$BUF_VERSION"
  mkdir -p "$CACHE"
  exec 8>"$CACHE/.install.lock"
  flock 8
  if installed; then exec 8>&-; return 0; fi
  local tmp="$CACHE/.tmp.$BUF_VERSION.$$" t0 ms
  t0=$(date +%s%3N)
  rm -rf "$tmp"
  mkdir -p "$tmp"
  log "installing @bufbuild/buf@$BUF_VERSION from the npm registry into $PREFIX ..."
  if ! "${NPM[@]}" install --prefix "$tmp" --no-save --no-package-lock --no-audit --no-fund --loglevel=error \
       "@bufbuild/buf@$BUF_VERSION" </dev/null >"$tmp.log" 2>&1; then
    cat "$tmp.log" >&2
    rm -rf "$tmp" "$tmp.log"
    die "npm install @bufbuild/buf@$BUF_VERSION failed"
  fi
  rm -f "$tmp.log"
  echo "$BUF_VERSION" >"$tmp/.complete"
  rm -rf "$PREFIX"
  mv "$tmp" "$PREFIX"
  exec 8>&-
  installed || die "buf $BUF_VERSION did not install correctly in $PREFIX"
  ms=$(( $(date +%s%3N) - t0 ))
  log "installed buf $BUF_VERSION in $(( ms / 1000 )).$(( ms % 1000 / 100 )) s"
}

cmd_lint() {
  cmd_install
  (cd "$ROOT" && "$BUF" lint proto)
  log "lint: proto/ passes"
}

cmd_breaking() {
  cmd_install
  command -v git >/dev/null 2>&1 || die "git not found"
  local gitdir range commits=() seen=" " c tree checked=0 failed=0
  gitdir="$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir)"
  range=HEAD
  if [[ -n "${BUF_BREAKING_SINCE:-}" ]]; then
    git -C "$ROOT" rev-parse --verify --quiet "${BUF_BREAKING_SINCE}^{commit}" >/dev/null \
      || die "BUF_BREAKING_SINCE=$BUF_BREAKING_SINCE is not a commit"
    range="$BUF_BREAKING_SINCE..HEAD"
  fi
  if git -C "$ROOT" rev-parse --verify --quiet HEAD >/dev/null; then
    mapfile -t commits < <(git -C "$ROOT" log --format=%H "$range" -- proto/)
    if [[ -n "${BUF_BREAKING_SINCE:-}" ]]; then
      commits+=("$(git -C "$ROOT" rev-parse "${BUF_BREAKING_SINCE}^{commit}")") # the new baseline itself
    fi
  fi
  # Every distinct earlier version of proto/, newest first. A version equal to the working
  # tree's proto/ (usually HEAD's own) is skipped: comparing it with itself tells nothing.
  for c in "${commits[@]}"; do
    tree="$(git -C "$ROOT" rev-parse --verify --quiet "$c:proto" || true)"
    if [[ -z "$tree" ]]; then
      continue # the commit deleted proto/
    fi
    [[ "$seen" == *" $tree "* ]] && continue
    seen+="$tree "
    if git -C "$ROOT" diff --quiet "$c" -- proto/ && [[ -z "$(git -C "$ROOT" ls-files --others --exclude-standard -- proto/)" ]]; then
      log "breaking: skipping ${c:0:12} (its proto/ is the working tree's)"
      continue
    fi
    checked=$((checked + 1))
    if (cd "$ROOT" && "$BUF" breaking proto --against "$gitdir#ref=$c,subdir=proto"); then
      log "breaking: no breaking change against ${c:0:12} ($(git -C "$ROOT" log -1 --format=%s "$c" | cut -c1-60))"
    else
      log "breaking: BREAKING CHANGE against ${c:0:12} ($(git -C "$ROOT" log -1 --format=%s "$c" | cut -c1-60))"
      failed=$((failed + 1))
    fi
  done
  if (( checked == 0 )); then
    log "breaking: no earlier version of proto/ on this branch to compare with: nothing to check, passes"
    return 0
  fi
  if (( failed > 0 )); then
    log "breaking: proto/ breaks $failed of $checked earlier versions. Within pin.crm.booking.v1 only additive"
    log "changes are allowed; a breaking change needs a new package (pin.crm.booking.v2) and topic (docs/consumers.md)"
    return 1
  fi
  log "breaking: proto/ is compatible with all $checked earlier versions"
}

main() {
  [[ $# -ge 1 ]] || { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
  local cmd="$1"
  shift
  case "$cmd" in
    install) [[ $# -eq 0 ]] || die "install takes no arguments"; cmd_install; echo "$BUF" ;;
    lint) [[ $# -eq 0 ]] || die "lint takes no arguments"; cmd_lint ;;
    breaking) [[ $# -eq 0 ]] || die "breaking takes no arguments"; cmd_breaking ;;
    check) [[ $# -eq 0 ]] || die "check takes no arguments"; cmd_lint; cmd_breaking ;;
    buf) cmd_install; cd "$ROOT"; exec "$BUF" "$@" ;;
    -h|--help|help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown command '$cmd' (install, lint, breaking, check, buf)" ;;
  esac
}

main "$@"
