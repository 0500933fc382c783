#!/usr/bin/env bash
# Builds morpc-interop (MatrixOne v1.2.4's own morpc and protobuf code, see main.go) into a
# cache outside the repository. Prints the binary path on stdout; logs go to stderr. Does
# nothing when the binary for the current go.mod, go.sum and *.go files exists.
#
# Needs only Go and the module proxy: the default build is CGO_ENABLED=0 (pkg/common/morpc,
# pkg/lockservice and pkg/pb/* of v1.2.4 contain no C code).
#
# MO_MORPC_INTEROP_KERNEL_LOGSERVICE=1 builds the variant that takes the logservice payload
# wrappers from the kernel's pkg/logservice instead of logmsg.go. That package needs cgo and
# the kernel's libmo.a, which is built here from the module's own cgo/ sources (gcc and make,
# a few seconds), then the build takes a few minutes longer.
set -euo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${MO_MORPC_INTEROP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mo-operator/morpc-interop}"
KERNEL_LOGSERVICE="${MO_MORPC_INTEROP_KERNEL_LOGSERVICE:-0}"

log() { echo "morpc-interop: $*" >&2; }

command -v go >/dev/null || { log "go is required"; exit 1; }

# The key covers the sources, the variant and the toolchain.
KEY=$(
  cd "$SRC"
  {
    for f in go.mod go.sum $(ls ./*.go | LC_ALL=C sort); do
      echo "== $f"
      cat "$f"
    done
    echo "== kernel-logservice=$KERNEL_LOGSERVICE $(go env GOVERSION GOOS GOARCH | tr '\n' ' ')"
  } | sha256sum | cut -c1-16
)
OUT="$CACHE_ROOT/$KEY"
BIN="$OUT/morpc-interop"

if [[ -x "$BIN" ]]; then
  log "cached: $BIN"
  echo "$BIN"
  exit 0
fi

mkdir -p "$OUT"
start=$(date +%s)
# go.sum is committed: fail rather than edit it. -buildvcs=false: the sources sit in the
# operator's git work tree, whose state must not change the binary.
export GOFLAGS="-mod=readonly -buildvcs=false"
cd "$SRC"

if [[ "$KERNEL_LOGSERVICE" == 1 ]]; then
  for tool in gcc make ar; do
    command -v "$tool" >/dev/null || { log "$tool is required for MO_MORPC_INTEROP_KERNEL_LOGSERVICE=1"; exit 1; }
  done
  # pkg/common/bitmap links -lmo from the module's cgo/ directory, which is read-only in the
  # module cache, so libmo.a is built in a copy and found through CGO_LDFLAGS instead.
  log "building libmo.a from github.com/matrixorigin/matrixone's cgo/"
  MODDIR=$(go mod download -json github.com/matrixorigin/matrixone | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  rm -rf "$OUT/libmo"
  mkdir -p "$OUT/libmo"
  cp "$MODDIR"/cgo/*.c "$MODDIR"/cgo/*.h "$MODDIR"/cgo/Makefile "$OUT/libmo/"
  chmod -R u+w "$OUT/libmo"
  make -s -C "$OUT/libmo" libmo.a >&2
  log "building (cgo, -tags kernellogservice)"
  CGO_ENABLED=1 CGO_LDFLAGS="-L$OUT/libmo" \
    go build -trimpath -tags kernellogservice -ldflags "-s -w" -o "$BIN.tmp.$$" .
else
  log "building (CGO_ENABLED=0)"
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN.tmp.$$" .
fi
# A per-process temporary name: concurrent builds each rename a complete binary.
mv "$BIN.tmp.$$" "$BIN"

log "built in $(($(date +%s) - start)) s: $BIN"
echo "$BIN"
