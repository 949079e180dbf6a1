#!/usr/bin/env bash
# Builds the pinned upstream binaries of the local control plane (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, helm)
# from the Go module proxy into a cache outside the repo, and reuses them when
# they are there.
#
#   bash scripts/build-kube.sh          # build what is missing, or print "cached"
#
# Output: ${SLIPSTREAM_KUBE_BIN:-~/.cache/slipstream/bin/<BIN_TAG>}/
# The tag names every pinned version, so bumping one builds a fresh directory
# instead of mixing releases. slipstream.localkube.default_bin_dir() computes
# the same path (a cluster test checks the two agree).
#
# The Kubernetes, etcd and kwok builds go through the wrapper modules committed
# in scripts/kube-build/ (go.mod + go.sum, so every dependency is pinned by
# hash); helm has no replace directives and installs straight from its module.
# kwok's default stages (the YAML that makes fake nodes Ready and pods Running)
# are not compiled into the kwok binary: they are copied from the same module
# version into kwok-stages.yaml next to it.
set -euo pipefail

K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
HELM_VERSION=v3.22.0
KWOK_VERSION=v0.8.0
BIN_TAG="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}_kwok-${KWOK_VERSION}"
# Release date of k8s.io/kubernetes v1.36.3 on the module proxy: a fixed
# buildDate makes every rebuild report the same version info.
K8S_BUILD_DATE=2026-07-22T18:07:38Z

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WRAPPER="$ROOT/scripts/kube-build"
OUT="${SLIPSTREAM_KUBE_BIN:-$HOME/.cache/slipstream/bin/$BIN_TAG}"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm)
# Files besides the binaries that the cache must hold to count as complete.
DATA_FILES=(kwok-stages.yaml)

# The installed toolchain only: a go.mod asking for a newer Go must fail here,
# not download a toolchain (no network for that on CI).
export GOTOOLCHAIN=local
# go.sum is committed: a missing or changed hash is an error, never a rewrite.
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$OUT"
  exit 0
fi

all_present() {
  local b
  for b in "${BINARIES[@]}"; do
    [[ -x "$OUT/$b" ]] || return 1
  done
  for b in "${DATA_FILES[@]}"; do
    [[ -s "$OUT/$b" ]] || return 1
  done
}

if all_present; then
  echo "==> kube binaries: cached in $OUT"
  exit 0
fi

command -v go >/dev/null || { echo "build-kube.sh: 'go' not found on PATH" >&2; exit 1; }
mkdir -p "$OUT"
echo "==> kube binaries: building into $OUT with $(go version)"
START_ALL=$SECONDS

# build NAME PRODUCED DIR GO-ARGS...: runs `go GO-ARGS` in DIR with a heartbeat
# line a minute (a cold build takes tens of minutes on two cores and CI logs
# must show it is alive), then moves PRODUCED into place, so a killed build
# never leaves a half-written binary that the cache check would accept.
build() {
  local name=$1 produced=$2 dir=$3
  shift 3
  if [[ -x "$OUT/$name" ]]; then
    echo "    $name: cached"
    return 0
  fi
  local start=$SECONDS
  echo "    $name: building ..."
  (
    while sleep 60; do
      echo "    $name: still building, $((SECONDS - start))s"
    done
  ) &
  local ticker=$!
  local rc=0
  (cd "$dir" && go "$@") || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  if [[ $rc -ne 0 ]]; then
    echo "build-kube.sh: building $name failed (exit $rc)" >&2
    exit "$rc"
  fi
  mv -f "$produced" "$OUT/$name"
  echo "    $name: done in $((SECONDS - start))s (total $((SECONDS - START_ALL))s)"
}

k8s_ldflags() {
  local minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  local flags="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$K8S_VERSION"
    flags+=" -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.buildDate=$K8S_BUILD_DATE"
    flags+=" -X $pkg.gitTreeState=clean"
  done
  echo "$flags"
}

build etcd "$OUT/.etcd.tmp" "$WRAPPER/etcd" \
  build -ldflags "-s -w" -o "$OUT/.etcd.tmp" go.etcd.io/etcd/server/v3

for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  build "$cmd" "$OUT/.$cmd.tmp" "$WRAPPER" \
    build -ldflags "$(k8s_ldflags)" -o "$OUT/.$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
done

# kwok's module pins its own k8s.io client libraries, so it builds in a sibling
# wrapper module (the version is in that go.mod; KWOK_VERSION must match it).
# It has no version ldflags to set: its consts carry the release.
grep -Eq "^\s*sigs\.k8s\.io/kwok $KWOK_VERSION( |$)" "$WRAPPER/kwok/go.mod" || {
  echo "build-kube.sh: KWOK_VERSION $KWOK_VERSION differs from scripts/kube-build/kwok/go.mod" >&2
  exit 1
}
build kwok "$OUT/.kwok.tmp" "$WRAPPER/kwok" \
  build -ldflags "-s -w" -o "$OUT/.kwok.tmp" sigs.k8s.io/kwok/cmd/kwok

# kwok's default stages, as kwokctl installs them: node-initialize and the lease
# heartbeat for nodes; pod-ready, pod-complete and pod-delete for pods. Written
# to a temporary file and renamed, like the binaries.
if [[ ! -s "$OUT/kwok-stages.yaml" ]]; then
  KWOK_SRC="$(cd "$WRAPPER/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  STAGES_TMP="$OUT/.kwok-stages.yaml.tmp"
  {
    echo "# kwok $KWOK_VERSION default stages, copied by scripts/build-kube.sh from"
    echo "# sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage/ (Apache-2.0)."
    for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
      pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
      echo "---"
      cat "$KWOK_SRC/kustomize/stage/$stage.yaml"
    done
  } > "$STAGES_TMP"
  mv -f "$STAGES_TMP" "$OUT/kwok-stages.yaml"
  echo "    kwok-stages.yaml: done"
fi

# helm's module has no replace directives, so `go install pkg@version` builds it
# with exactly its own go.mod and go.sum (checked against the checksum
# database); it runs outside any module, with GOBIN a scratch directory.
HELM_TMP="$(mktemp -d)"
trap 'rm -rf "$HELM_TMP"' EXIT
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
helm_ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
GOBIN="$HELM_TMP" GOFLAGS=-buildvcs=false build helm "$HELM_TMP/helm" "$HELM_TMP" \
  install -ldflags "$helm_ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"

all_present || { echo "build-kube.sh: a binary is missing after the build" >&2; exit 1; }
echo "==> kube binaries: built in $((SECONDS - START_ALL))s into $OUT"
