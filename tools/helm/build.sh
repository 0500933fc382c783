#!/usr/bin/env bash
# Builds helm (v3, pinned below) from the Go module proxy into a cache outside the repository.
# Prints the path of the helm binary on stdout. Does nothing when it is already built.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.21.4}"
CACHE_ROOT="${MO_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mo-operator/helm}"
BIN="$CACHE_ROOT/$HELM_VERSION/bin"

log() { echo "helm: $*" >&2; }

if [[ -x "$BIN/helm" ]]; then
  log "cached in $BIN"
  echo "$BIN/helm"
  exit 0
fi

command -v go >/dev/null || { log "go is required"; exit 1; }
mkdir -p "$BIN"
start=$(date +%s)
log "building helm ${HELM_VERSION}"
# go install of a tagged module: the module's own go.sum pins every dependency.
CGO_ENABLED=0 GOBIN="$BIN.tmp" go install -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}" \
  "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
mv "$BIN.tmp/helm" "$BIN/helm"
rmdir "$BIN.tmp"
log "built in $(( $(date +%s) - start )) s into $BIN"
echo "$BIN/helm"
