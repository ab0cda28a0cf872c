#!/usr/bin/env bash
# Images for the real node, built here and imported into its containerd (no registry, no pulls):
#   images.sh base              localhost/pause:dev (the sandbox; tools/pause) and
#                               localhost/busybox:dev (Debian's busybox-static, Cmd sh)
#   images.sh pullman [BINARY]  localhost/pullman:dev: config/image/rootfs.sh on BINARY (default
#                               target/debug/pullman), USER and ENTRYPOINT from the Dockerfile
#   images.sh shipwright-tools BIN_DIR  localhost/shipwright-tools:dev (below; e2e/shipwright)
#   images.sh cnpg-postgresql BIN_DIR   localhost/cnpg-postgresql:<major.minor> (below; e2e/cnpg)
# Needs STATE (or PULLMAN_TESTENV_STATE) of a running testenv with a real node. Prints nothing on
# stdout but the name of the image cnpg-postgresql built;
# says in one line what is missing when it cannot build or import.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
STATE="${STATE:-${PULLMAN_TESTENV_STATE:-/tmp/pullman-testenv}}"
SOCK="$STATE/node/containerd.sock"
log() { echo "images.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[[ -S "$SOCK" ]] || die "no containerd at $SOCK: is the test control plane up with its real node (up.sh)?"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/pullman-image.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

import() { # import <tar> <ref>
  ctr --address "$SOCK" --namespace k8s.io images import "$1" >/dev/null \
    || die "ctr images import of $2 failed"
  local refs
  refs="$(ctr --address "$SOCK" --namespace k8s.io images ls -q)"
  grep -qx "$2" <<<"$refs" || die "$2 is not in containerd after import"
  log "imported $2 ($(( $(stat -c %s "$1") / 1024 )) KiB)"
}

# busybox_rootfs DIR: Debian's static busybox with every applet, /tmp, and root and nobody.
busybox_rootfs() {
  local bb="$1" b
  b="$(command -v busybox)" || die "busybox is missing (apt install busybox-static)"
  # ldd fails on a static binary, and says so.
  { ldd "$b" 2>&1 || true; } | grep -q 'not a dynamic' || die "$b is not statically linked (apt install busybox-static)"
  mkdir -p "$bb/bin" "$bb/tmp" "$bb/etc"
  chmod 1777 "$bb/tmp"
  cp -L "$b" "$bb/bin/busybox"
  for applet in $("$b" --list); do [[ "$applet" == busybox ]] || ln -s busybox "$bb/bin/$applet"; done
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' > "$bb/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' > "$bb/etc/group"
}

base() {
  local pause="$WORK/pause"
  mkdir -p "$pause"
  (cd "$HERE/tools/pause" && CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN="${GOTOOLCHAIN:-local}" \
    go build -trimpath -ldflags "-s -w" -o "$pause/pause" .) || die "building the pause program failed"
  "$HERE/image.py" --tag localhost/pause:dev --rootfs "$pause" --user 65535 --entrypoint '["/pause"]' -o "$WORK/pause.tar"
  import "$WORK/pause.tar" localhost/pause:dev

  local bb="$WORK/busybox"
  busybox_rootfs "$bb"
  # A Cmd, not an Entrypoint, as busybox's own image: `args: [sh, -c, ...]` must run as written.
  "$HERE/image.py" --tag localhost/busybox:dev --rootfs "$bb" --cmd '["sh"]' -o "$WORK/busybox.tar"
  import "$WORK/busybox.tar" localhost/busybox:dev
}

pullman() {
  local bin="${1:-$ROOT/target/debug/pullman}"
  [[ -x "$bin" ]] || die "no pullman binary at $bin (cargo build --bin pullman)"
  "$ROOT/config/image/rootfs.sh" "$bin" "$WORK/pullman"
  "$HERE/image.py" --tag localhost/pullman:dev --rootfs "$WORK/pullman" --dockerfile "$ROOT/Dockerfile" -o "$WORK/pullman.tar"
  import "$WORK/pullman.tar" localhost/pullman:dev
}

# localhost/shipwright-tools:dev: busybox, and at /ko-app/<name> (where Tekton's and Shipwright's
# controllers start them, as `ko` lays out their released images) the helpers of build pods
# (entrypoint, nop, sidecarlogresults, workingdirinit; image-processing, waiter, bundle) and
# crane, and at /kaniko/executor kaniko's executor, from the bin directory of
# e2e/shipwright/build.sh. One image for every role: the controllers are told
# its name for each.
shipwright_tools() {
  local bin="${1:?usage: images.sh shipwright-tools BIN_DIR}" root="$WORK/shipwright-tools" t
  busybox_rootfs "$root"
  mkdir -p "$root/ko-app"
  for t in entrypoint nop sidecarlogresults workingdirinit image-processing waiter bundle crane; do
    [[ -x "$bin/$t" ]] || die "no $t in $bin (e2e/shipwright/build.sh)"
    cp "$bin/$t" "$root/ko-app/$t"
  done
  # kaniko where its own image keeps it: a kaniko build empties the container's file system but
  # for /kaniko (and mounts) before it unpacks the base image.
  [[ -x "$bin/kaniko-executor" ]] || die "no kaniko-executor in $bin (e2e/shipwright/build.sh)"
  mkdir -p "$root/kaniko/ssl/certs"
  cp "$bin/kaniko-executor" "$root/kaniko/executor"
  "$HERE/image.py" --tag localhost/shipwright-tools:dev --rootfs "$root" --cmd '["sh"]' -o "$WORK/shipwright-tools.tar"
  import "$WORK/shipwright-tools.tar" localhost/shipwright-tools:dev
}

# localhost/cnpg-postgresql:<major.minor>, for CloudNativePG (e2e/cnpg): this machine's
# PostgreSQL server (Debian's postgresql-<major>: its bin and lib directories, its share
# directory, the shared libraries their loader needs, the time zones), busybox for the
# archive_command's /bin/sh, user postgres as uid/gid 26 (CloudNativePG's default), and at
# /manager CloudNativePG's manager from BIN_DIR (e2e/cnpg/build.sh): the bootstrap init container
# copies it into each pod. The tag is the server's version, which CloudNativePG reads the major
# version from. Prints the image's name on stdout.
cnpg_postgresql() {
  local bin="${1:?usage: images.sh cnpg-postgresql BIN_DIR}" root="$WORK/cnpg-postgresql"
  local pgbin version major f lib
  pgbin="$(ls -d /usr/lib/postgresql/*/bin/postgres 2>/dev/null | sort -V | tail -n 1)"
  [[ -n "$pgbin" ]] || die "no PostgreSQL server in /usr/lib/postgresql (apt install postgresql)"
  pgbin="$(dirname "$pgbin")"
  version="$("$pgbin/postgres" -V | awk '{ print $3 }')"   # "postgres (PostgreSQL) 15.18 (Debian …)"
  major="${version%%.*}"
  [[ -x "$bin/manager" ]] || die "no manager in $bin (e2e/cnpg/build.sh)"
  busybox_rootfs "$root"
  install -m 0755 "$bin/manager" "$root/manager"
  mkdir -p "$root/usr/lib/postgresql" "$root/usr/share/postgresql" "$root/usr/share"
  cp -a "/usr/lib/postgresql/$major" "$root/usr/lib/postgresql/"
  cp -a "/usr/share/postgresql/$major" "$root/usr/share/postgresql/"
  cp -a /usr/share/zoneinfo "$root/usr/share/"
  # No JIT: its LLVM would double the image, and Pullman's connections turn it off.
  rm -rf "$root/usr/lib/postgresql/$major/lib/bitcode" "$root/usr/lib/postgresql/$major/lib/llvmjit"*
  for f in "$root/usr/lib/postgresql/$major"/bin/* "$root/usr/lib/postgresql/$major"/lib/*.so; do
    ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
  done | sort -u | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
  echo 'postgres:x:26:26:PostgreSQL:/var/lib/postgresql:/bin/sh' >> "$root/etc/passwd"
  echo 'postgres:x:26:' >> "$root/etc/group"
  mkdir -p "$root/var/lib/postgresql" "$root/var/run/postgresql"
  chmod 1777 "$root/var/run/postgresql"
  "$HERE/image.py" --tag "localhost/cnpg-postgresql:$version" --rootfs "$root" --user 26 \
    --path "/usr/lib/postgresql/$major/bin:/usr/bin:/bin" --cmd '["postgres"]' -o "$WORK/cnpg-postgresql.tar"
  import "$WORK/cnpg-postgresql.tar" "localhost/cnpg-postgresql:$version"
  echo "localhost/cnpg-postgresql:$version"
}

case "${1:-}" in
  base) base ;;
  pullman) shift; pullman "$@" ;;
  shipwright-tools) shift; shipwright_tools "$@" ;;
  cnpg-postgresql) shift; cnpg_postgresql "$@" ;;
  *) echo "usage: images.sh base | pullman [BINARY] | shipwright-tools BIN_DIR | cnpg-postgresql BIN_DIR" >&2; exit 2 ;;
esac
