#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-controller-manager, kubectl)
# from the Go module proxy, at the versions pinned below, into a cache outside the repository.
# Prints the bin directory on stdout. Does nothing when the binaries for these versions exist.
#
# The Kubernetes version matches the k8s-openapi feature the operator is built with (v1_37).
set -euo pipefail

KUBERNETES_VERSION="${KUBERNETES_VERSION:-v1.37.2}"
# The etcd server version k8s.io/kubernetes ${KUBERNETES_VERSION} itself requires.
ETCD_VERSION="${ETCD_VERSION:-v3.7.0}"
CACHE_ROOT="${MO_CONTROL_PLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mo-operator/control-plane}"
KEY="k8s-${KUBERNETES_VERSION}-etcd-${ETCD_VERSION}"
OUT="$CACHE_ROOT/$KEY"
BIN="$OUT/bin"

log() { echo "control-plane: $*" >&2; }

if [[ -x "$BIN/etcd" && -x "$BIN/kube-apiserver" && -x "$BIN/kube-controller-manager" && -x "$BIN/kubectl" ]]; then
  log "cached in $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { log "go is required"; exit 1; }
export GOFLAGS=-mod=mod
export CGO_ENABLED=0
WORK="$OUT/src"
rm -rf "$WORK"
mkdir -p "$WORK/kubernetes" "$WORK/etcd" "$BIN"
start=$(date +%s)

# --- Kubernetes: a wrapper module that requires k8s.io/kubernetes and pins every staging
# module (which k8s.io/kubernetes replaces with ./staging/src/...) to the published v0.X.Y.
log "resolving k8s.io/kubernetes@${KUBERNETES_VERSION}"
GOMOD=$(cd "$WORK" && go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
STAGING_VERSION="v0.${KUBERNETES_VERSION#v1.}"
{
  echo "module mo-operator.test/control-plane/kubernetes"
  echo
  sed -n 's/^go \(.*\)/go \1/p' "$GOMOD"
  echo
  echo "require k8s.io/kubernetes ${KUBERNETES_VERSION}"
  echo
  # Same pins as Kubernetes itself, so the build is the one upstream tested.
  awk '/^require \(/{inreq=1; print; next} inreq && /^\)/{inreq=0; print; next} inreq{print}' "$GOMOD"
  echo
  echo "replace ("
  grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/' "$GOMOD" | awk -v v="$STAGING_VERSION" '{print "\t" $1 " => " $1 " " v}'
  echo ")"
} > "$WORK/kubernetes/go.mod"
cat > "$WORK/kubernetes/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
(
  cd "$WORK/kubernetes"
  log "downloading modules"
  go mod tidy -e >/dev/null 2>&1 || true
  for cmd in kube-apiserver kube-controller-manager kubectl; do
    log "building $cmd"
    go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=${KUBERNETES_VERSION} -X k8s.io/client-go/pkg/version.gitVersion=${KUBERNETES_VERSION}" -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
    mv "$BIN/$cmd.tmp" "$BIN/$cmd"
  done
)

# --- etcd: the server module exposes etcdmain; a three-line main runs it.
cat > "$WORK/etcd/go.mod" <<GOMOD
module mo-operator.test/control-plane/etcd

go 1.25

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
GOMOD
cat > "$WORK/etcd/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
(
  cd "$WORK/etcd"
  log "building etcd ${ETCD_VERSION}"
  go mod tidy >/dev/null
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" .
  mv "$BIN/etcd.tmp" "$BIN/etcd"
)

log "built in $(( $(date +%s) - start )) s into $BIN"
echo "$BIN"
