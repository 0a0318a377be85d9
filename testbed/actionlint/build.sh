#!/usr/bin/env bash
# Builds, once per machine, actionlint (the GitHub Actions workflow linter) from its Go module through the Go module
# proxy, pinned by the go.mod and go.sum beside this script; tests/deploy/test_release.py runs it on
# .github/workflows. The binary goes into ${XDG_CACHE_HOME:-~/.cache}/vgpu-sharing/actionlint-<key>/, keyed by this
# folder's files and the Go version; a later run finds it and returns at once.
#
#   testbed/actionlint/build.sh    build it if missing; print the binary's path
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
key=$( { cat "$here/build.sh" "$here/go.mod" "$here/go.sum"; go version; } | sha256sum | cut -c1-12)
out="${XDG_CACHE_HOME:-$HOME/.cache}/vgpu-sharing/actionlint-$key"
if [ ! -x "$out/actionlint" ]; then
  mkdir -p "$out.partial"
  (cd "$here" && GOFLAGS="-mod=readonly -trimpath -buildvcs=false" go build -ldflags "-s -w" -o "$out.partial/" \
    github.com/rhysd/actionlint/cmd/actionlint)
  rm -rf "$out" && mv "$out.partial" "$out"
fi
echo "$out/actionlint"
