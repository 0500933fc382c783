#!/usr/bin/env bash
# Builds the real MatrixOne kernel (`mo-service`) from the Go module proxy into a cache outside
# the repository, one binary per version. Logs go to stderr; the LAST line of stdout is the
# binaries' paths separated by spaces, in the order of MO_KERNEL_VERSIONS. Does nothing for a
# version whose binary is cached.
#
#   MO_KERNEL_VERSIONS   versions to build, default "v1.2.3 v1.2.4"
#   MO_KERNEL_CACHE      cache root, default ${XDG_CACHE_HOME:-$HOME/.cache}/mo-operator/matrixone
#   MO_KERNEL_SOURCE_FOR_<version with . and - as _>
#                        build <version> from another module version's source, stamped as
#                        <version>; e.g. MO_KERNEL_SOURCE_FOR_v1_2_3=v1.2.4 builds v1.2.4's code
#                        with Version "v1.2.3" (its CommitID stays v1.2.4's commit: it is that
#                        code).
#   MO_KERNEL_JOBS       go build -p, default 2
#
# Recipe (the kernel's own Makefile, `make build`, without git): copy the module into a writable
# directory (<cache>/.src/<source version>, kept), build cgo/libmo.a with make, then
#   CGO_ENABLED=1 CGO_CFLAGS=-I<src>/cgo CGO_LDFLAGS="-L<src>/cgo -lm -lmo" go build ./cmd/mo-service
# with pkg/version's variables stamped through -ldflags -X as the kernel's Makefile stamps the
# official images: CommitID is the source's git commit, short (`git rev-parse --short HEAD`; here
# the first 7 digits of the commit the module proxy names for the tag), Version the tag. CommitID
# is the only version field a store sends to HAKeeper (CN heartbeats only,
# pkg/cnservice/server_heartbeat.go -> CNStore.CommitID), and CNs only schedule remote pipelines
# on CNs with the same CommitID (pkg/vm/engine/disttae/engine.go Nodes). BuildTime must be Unix
# seconds: SQL build_version() parses it as an integer (pkg/sql/plan/function/func_unary.go).
# `mo-service -version` prints what was stamped.
# Measured on 2 cores: 8.5-10 min per version cold, 7 s for another stamp of a built source,
# 0.02 s when cached; 120 MB per binary.
# Needs Go, gcc, make, ar and flock; tagged versions need no GONOSUMDB (a pseudo-version would need
# GONOSUMDB=github.com/matrixorigin).
set -euo pipefail

VERSIONS="${MO_KERNEL_VERSIONS:-v1.2.3 v1.2.4}"
CACHE_ROOT="${MO_KERNEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mo-operator/matrixone}"
JOBS="${MO_KERNEL_JOBS:-2}"
MODULE=github.com/matrixorigin/matrixone
# Bump when the recipe below changes in a way that changes the binary.
# 2: CommitID is the source's short git commit (was the tag).
RECIPE=2

log() { echo "matrixone: $*" >&2; }

for tool in go gcc make ar flock; do
  command -v "$tool" >/dev/null || { log "$tool is required"; exit 1; }
done

GOV=$(go env GOVERSION GOOS GOARCH | tr '\n' ' ')
LDBASE="-s -w"

build_one() {
  local version="$1" var source key out bin info moddir commit work start ldflags buildtime
  var="MO_KERNEL_SOURCE_FOR_${version//[.-]/_}"
  source="${!var:-$version}"
  key=$(echo "recipe=$RECIPE source=$source stamp=$version go=$GOV ld=$LDBASE" | sha256sum | cut -c1-12)
  out="$CACHE_ROOT/$version-$key"
  bin="$out/mo-service"
  if [[ -x "$bin" ]]; then
    log "$version: cached: $bin"
    BINS+=("$bin")
    return
  fi
  if [[ "$source" != "$version" ]]; then
    log "$version: building from the source of $source, stamped $version ($var)"
  fi
  start=$(date +%s)
  mkdir -p "$out"
  log "$version: downloading $MODULE@$source"
  # Run outside any module so that the work tree's go.mod (if any) plays no part.
  info=$(cd / && GOFLAGS=-mod=mod go mod download -json "$MODULE@$source")
  moddir=$(sed -n 's/.*"Dir": "\(.*\)".*/\1/p' <<<"$info")
  [[ -n "$moddir" && -d "$moddir" ]] || { log "$version: cannot download $MODULE@$source"; exit 1; }
  # The commit behind the tag, as the proxy's origin record names it.
  commit=$(sed -n 's/.*"Hash": "\([0-9a-f]\{40\}\)".*/\1/p' <<<"$info" | head -1)
  [[ -n "$commit" ]] || { log "$version: the module proxy names no commit for $source"; exit 1; }
  commit=${commit:0:7}

  # One writable copy per source version, kept: the cgo flags name its path, so a stable path keeps
  # Go's build cache valid across rebuilds and across stamps of one source (then only the link
  # step runs). A lock serialises builds that share the copy.
  work="$CACHE_ROOT/.src/$source"
  mkdir -p "$CACHE_ROOT/.src"
  exec 9>"$work.lock"
  flock 9
  if [[ ! -e "$work/.ready" ]]; then
    rm -rf "$work"
    cp -r "$moddir" "$work"
    chmod -R u+w "$work"
    log "$version: building cgo/libmo.a"
    make -s -C "$work/cgo" libmo.a >&2
    touch "$work/.ready"
  fi

  buildtime=$(date +%s)
  ldflags="$LDBASE"
  ldflags+=" -X '$MODULE/pkg/version.Version=$version'"
  ldflags+=" -X '$MODULE/pkg/version.CommitID=$commit'"
  ldflags+=" -X '$MODULE/pkg/version.BranchName=$source'"
  ldflags+=" -X '$MODULE/pkg/version.BuildTime=$buildtime'"
  ldflags+=" -X '$MODULE/pkg/version.GoVersion=$(go env GOVERSION)'"
  log "$version: go build ./cmd/mo-service (-p $JOBS; several minutes on 2 cores when Go's build cache is cold)"
  (
    cd "$work"
    # The copied module is the main module; its go.sum covers every dependency. -buildvcs=false:
    # the copy is no repository.
    GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=1 \
      CGO_CFLAGS="-I$work/cgo" CGO_LDFLAGS="-L$work/cgo -lm -lmo" \
      go build -p "$JOBS" -trimpath -ldflags "$ldflags" -o "$bin.tmp.$$" ./cmd/mo-service
  )
  # A per-process temporary name: concurrent builds each rename a complete binary.
  mv "$bin.tmp.$$" "$bin"
  exec 9>&-
  printf 'version=%s\nsource=%s\ncommit=%s\nbuildtime=%s\ngo=%s\n' "$version" "$source" "$commit" "$buildtime" "$GOV" > "$out/BUILD-INFO"
  log "$version: built in $(($(date +%s) - start)) s: $bin ($(du -m "$bin" | cut -f1) MB)"
  BINS+=("$bin")
}

BINS=()
for v in $VERSIONS; do
  build_one "$v"
done
echo "${BINS[*]}"
