# shellcheck shell=bash
# Component versions, read from the wrapper modules' go.mod files (the single
# source of truth; bump them there and refresh go.sum, see README.md).
_testenv_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_modver() { awk -v m="$2" '$1 == m || ($1 == "require" && $2 == m) { v = ($1 == "require") ? $3 : $2; print v; exit }' "$_testenv_dir/tools/$1/go.mod"; }
K8S_VERSION="$(_modver k8s k8s.io/kubernetes)"
ETCD_VERSION="$(_modver etcd go.etcd.io/etcd/server/v3)"
KWOK_VERSION="$(_modver kwok sigs.k8s.io/kwok)"
COREDNS_VERSION="$(_modver coredns github.com/coredns/coredns)"
HELM_VERSION="$(_modver helm helm.sh/helm/v3)"  # optional (PULLMAN_TESTENV_HELM=1)
unset -f _modver
unset _testenv_dir
: "${K8S_VERSION:?cannot read k8s.io/kubernetes version from tools/k8s/go.mod}"
: "${ETCD_VERSION:?cannot read etcd version from tools/etcd/go.mod}"
: "${KWOK_VERSION:?cannot read kwok version from tools/kwok/go.mod}"
: "${COREDNS_VERSION:?cannot read coredns version from tools/coredns/go.mod}"
