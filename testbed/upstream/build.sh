#!/usr/bin/env bash
# Builds, once per machine, the upstream programs the real-Kubernetes test tier runs (tests/realk8s): kube-apiserver,
# kube-controller-manager, kube-scheduler and kubelet at one Kubernetes release, an etcd server, containerd with its
# runc shim and ctr, crictl, the CNI loopback plugin and a pause binary. Each Go program is built from its module
# through the Go module proxy, pinned by the go.mod and go.sum beside this script (checksums verified); nothing is
# taken from anywhere else.
#
# The programs go into a folder keyed by what decides them (this script, the go.mod/go.sum files, the C sources and
# the Go version): ${VGPU_UPSTREAM_CACHE:-~/.cache/vgpu-sharing/upstream}/<key>/bin, with manifest.json beside it
# (module versions, build seconds). A later run finds the folder and returns at once.
#
#   testbed/upstream/build.sh          build what is missing; print the folder
#   testbed/upstream/build.sh --dir    print the folder if it is built, exit 1 otherwise (builds nothing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache_root=${VGPU_UPSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vgpu-sharing/upstream}
k8s_version=$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$here/kubernetes/go.mod")
key=$( { cat "$here/build.sh"; find "$here" -name go.mod -o -name go.sum -o -name '*.go' -o -name '*.c' \
         -o -name '*.py' | sort | xargs cat; go version; } | sha256sum | cut -c1-12)
out="$cache_root/kubernetes-$k8s_version-$key"

if [ "${1:-}" = "--dir" ]; then
  [ -f "$out/manifest.json" ] || { echo "upstream programs not built: run testbed/upstream/build.sh" >&2; exit 1; }
  echo "$out"
  exit 0
fi
if [ -f "$out/manifest.json" ]; then
  echo "$out"
  exit 0
fi

work="$out.partial"
rm -rf "$work"
mkdir -p "$work/bin"
export GOFLAGS="-mod=readonly -trimpath -buildvcs=false"
timings=""
progress() { echo "upstream: $*" >&2; }

# build NAME MODULE_DIR LDFLAGS PACKAGE...: go build the packages of one module into bin/ (build tags from $TAGS)
build() {
  local name=$1 dir=$2 ldflags=$3
  shift 3
  local start=$SECONDS
  progress "building $name ($*)"
  (cd "$here/$dir" && go build -tags "${TAGS:-}" -ldflags "-s -w $ldflags" -o "$work/bin/" "$@")
  timings="$timings\"$name\": $((SECONDS - start)), "
}

minor=${k8s_version#v1.}
minor=${minor%%.*}
version_flags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  version_flags="$version_flags -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  version_flags="$version_flags -X $pkg.gitTreeState=clean"
done
build kubernetes kubernetes "$version_flags" k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet
build etcd etcd "" .
# containerd's release build leaves out the btrfs (cgo, its headers), zfs and devmapper snapshotters by these tags;
# static, like its shim's release build and crictl's and the CNI plugins' (CGO_ENABLED=0)
CGO_ENABLED=0 TAGS="no_btrfs no_zfs no_devmapper urfave_cli_no_docs" build containerd containerd "" \
  github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr
CGO_ENABLED=0 build cri-tools cri-tools "" sigs.k8s.io/cri-tools/cmd/crictl
CGO_ENABLED=0 build cni cni "" github.com/containernetworking/plugins/plugins/main/loopback \
  github.com/containernetworking/plugins/plugins/main/tap github.com/containernetworking/plugins/plugins/ipam/host-local
progress "building pause and the images"
gcc -O2 -Wall -Werror -static -s -o "$work/bin/pause" "$here/pause/pause.c"
python3 "$here/images.py" "$work/images" "$work/bin/pause"

# each module's version as its own folder pins it (another folder's module graph may hold an older one)
versions=$(for pair in kubernetes=k8s.io/kubernetes etcd=go.etcd.io/etcd/server/v3 \
    containerd=github.com/containerd/containerd/v2 cri-tools=sigs.k8s.io/cri-tools \
    cni=github.com/containernetworking/plugins; do
  (cd "$here/${pair%%=*}" && go list -m -f '"{{.Path}}": "{{.Version}}",' "${pair#*=}")
done | tr '\n' ' ')
cat > "$work/manifest.json" <<EOF
{"kubernetes": "$k8s_version", "modules": {${versions%, }}, "build_seconds": {${timings%, }},
 "go": "$(go env GOVERSION)", "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}
EOF
rm -rf "$out"
mv "$work" "$out"
progress "built in $SECONDS s: $out"
echo "$out"
