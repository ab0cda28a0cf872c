#!/usr/bin/env bash
# The Pullman image's whole file system, made from a built `pullman` binary: the binary at
# /usr/local/bin/pullman, the shared libraries its loader needs (from the machine that built it,
# at the paths `ldd` names), the CA bundle, and passwd/group entries for user 65532. Nothing else:
# no shell, no package manager.
#
# Both builds use it, so they cannot drift: the Dockerfile's build stage runs it and copies the
# result into an empty image, and e2e/testenv/images.sh runs it to import `localhost/pullman:dev`
# into the test node's containerd. e2e/realnode/test.sh checks that the Dockerfile's last stage is
# this file system with the user and entrypoint images.sh reads, and pod-check.sh that every
# Pullman container runs exactly these files.
#
# Usage: config/image/rootfs.sh <pullman binary> <empty output directory>
set -euo pipefail
[[ $# == 2 ]] || { echo "usage: $0 <pullman binary> <empty output directory>" >&2; exit 2; }
bin="$1" out="$2"
[[ -x "$bin" ]] || { echo "$0: $bin is not an executable" >&2; exit 1; }
[[ ! -e "$out" || -z "$(ls -A "$out")" ]] || { echo "$0: $out is not empty" >&2; exit 1; }
ca=/etc/ssl/certs/ca-certificates.crt
[[ -f "$ca" ]] || { echo "$0: no CA bundle at $ca (apt install ca-certificates)" >&2; exit 1; }

mkdir -p "$out"/usr/local/bin "$out"/etc/ssl/certs "$out"/tmp
chmod 1777 "$out"/tmp
install -m 0755 "$bin" "$out"/usr/local/bin/pullman
# "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" and "/lib64/ld-linux-x86-64.so.2 (0x…)":
# each copied (links followed) to the path the loader will look at.
ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u |
  while read -r lib; do
    mkdir -p "$out$(dirname "$lib")"
    cp -L "$lib" "$out$lib"
  done
cp -L "$ca" "$out$ca"
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'pullman:x:65532:65532:pullman:/nonexistent:/sbin/nologin' > "$out"/etc/passwd
printf '%s\n' 'root:x:0:' 'pullman:x:65532:' > "$out"/etc/group
