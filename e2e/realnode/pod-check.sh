#!/usr/bin/env bash
# The runtime proof of a pod's security context on the real node: for each of its containers,
# the process that runs it, read from /proc on this machine, has user and group 65532 (real,
# effective, saved and file system ids) and its root file system mounted read-only.
# Usage: pod-check.sh <namespace> <pod>   (STATE: the test control plane's state directory)
set -euo pipefail
STATE="${STATE:-${PULLMAN_TESTENV_STATE:-/tmp/pullman-testenv}}"
ctr_() { ctr --address "$STATE/node/containerd.sock" --namespace k8s.io "$@"; }
ns="$1" pod="$2" checked=0
for id in $(ctr_ containers ls -q); do
  # A container may go while we look (a finished hook pod): skip it.
  labels="$(ctr_ containers info "$id" 2>/dev/null | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin).get("Labels", {})))' 2>/dev/null)" || continue
  read -r cns cpod cname kind < <(python3 -c '
import json, sys
l = json.loads(sys.argv[1])
print(l.get("io.kubernetes.pod.namespace", "-"), l.get("io.kubernetes.pod.name", "-"),
      l.get("io.kubernetes.container.name", "-"), l.get("io.cri-containerd.kind", "-"))' "$labels")
  [[ "$cns" == "$ns" && "$cpod" == "$pod" && "$kind" == container ]] || continue
  pid="$(ctr_ tasks ls | awk -v id="$id" '$1 == id && $3 == "RUNNING" { print $2 }')"
  [[ -n "$pid" && -d "/proc/$pid" ]] || continue
  uids="$(awk '/^Uid:/ { print $2, $3, $4, $5 }' "/proc/$pid/status")"
  gids="$(awk '/^Gid:/ { print $2, $3, $4, $5 }' "/proc/$pid/status")"
  [[ "$uids" == "65532 65532 65532 65532" ]] || { echo "$ns/$pod container $cname runs with uids $uids, not 65532" >&2; exit 1; }
  [[ "$gids" == "65532 65532 65532 65532" ]] || { echo "$ns/$pod container $cname runs with gids $gids, not 65532" >&2; exit 1; }
  # mountinfo: "id parent major:minor root mountpoint options ..."; the container's / .
  opts="$(awk '$5 == "/" { print $6 }' "/proc/$pid/mountinfo" | tail -n1)"
  [[ ",$opts," == *,ro,* ]] || { echo "$ns/$pod container $cname has its root file system mounted $opts" >&2; exit 1; }
  # And the kernel agrees: not even root on this machine can create a file there.
  if touch "/proc/$pid/root/.pullman-rw-probe" 2>/dev/null; then
    rm -f "/proc/$pid/root/.pullman-rw-probe"
    echo "$ns/$pod container $cname: its root file system took a write" >&2; exit 1
  fi
  # The file system is the image's recipe (config/image/rootfs.sh), as the Dockerfile builds it:
  # every file it makes is there, and no other file (what the kubelet mounts in, /etc/hosts and
  # the like, is not the image's).
  if [[ -n "${EXPECTED_FILES:-}" ]]; then
    actual="$(comm -23 <(cd "/proc/$pid/root" && find . -xdev -type f | sort) \
                       <(awk '{ print "." $5 }' "/proc/$pid/mountinfo" | sort))"
    missing="$(while read -r f; do [[ -e "/proc/$pid/root/$f" ]] || echo "$f"; done < "$EXPECTED_FILES")"
    extra="$(comm -13 "$EXPECTED_FILES" <(echo "$actual"))"
    [[ -z "$missing" ]] || { echo "$ns/$pod container $cname lacks what rootfs.sh makes: $missing" >&2; exit 1; }
    [[ -z "$extra" ]] || { echo "$ns/$pod container $cname has files rootfs.sh does not make: $extra" >&2; exit 1; }
  fi
  checked=$((checked + 1))
done
(( checked > 0 )) || { echo "no running container of $ns/$pod on the real node" >&2; exit 1; }
echo "    $ns/$pod: $checked container(s) as 65532:65532, root file system read-only" >&2
