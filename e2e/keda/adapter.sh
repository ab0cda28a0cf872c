# Sourced by e2e/keda/test.sh once KEDA's operator runs: KEDA's metrics API server (cmd/adapter,
# built with the operator by build.sh) on this machine, registered with the test control plane's
# aggregation layer, so the HPA that KEDA makes reads `external.metrics.k8s.io` as on any cluster.
#
#   HPA controller -> kube-apiserver -> APIService v1beta1.external.metrics.k8s.io
#     -> Service keda-metrics-apiserver (ExternalName localhost, the adapter's port)
#     -> keda-adapter (TLS, trusts the API server's front-proxy client certificate)
#     -> keda-operator's metrics service (gRPC, mutual TLS from $WORK/certs) -> the scaler
#
# Uses from test.sh: k, ok, fail, until_true, free_port, NS, WORK, KEDA_BIN, GRPC_PORT, PIDS.
# The ExternalName Service is how a host process stands behind an APIService: the aggregator
# resolves an ExternalName to its name and the APIService's port (k8s.io/apiserver's
# ResolveCluster), with no kube-proxy or endpoints involved. test.sh's clean-up deletes the
# APIService before anything else: an APIService that does not answer makes namespace deletion
# fail (discovery) for every later test.

ADAPTER_PORT="$(free_port)"
mkdir -p "$WORK/adapter-certs"
# The gRPC client's identity is the operator's own certificate (one self-signed pair is the CA, the
# server and the client here); the adapter writes its self-signed serving pair beside it.
cp "$WORK/certs/ca.crt" "$WORK/certs/tls.crt" "$WORK/certs/tls.key" "$WORK/adapter-certs/"
WATCH_NAMESPACE="$NS" KEDA_CLUSTER_OBJECT_NAMESPACE="$NS" POD_NAMESPACE="$NS" \
  "$KEDA_BIN/keda-adapter" --secure-port="$ADAPTER_PORT" --bind-address=127.0.0.1 \
  --cert-dir="$WORK/adapter-certs" --lister-kubeconfig="$KUBECONFIG" \
  --authentication-kubeconfig="$KUBECONFIG" --authorization-kubeconfig="$KUBECONFIG" \
  --metrics-service-address="127.0.0.1:$GRPC_PORT" --port="$(free_port)" \
  --zap-log-level=info > "$WORK/adapter.log" 2>&1 &
PIDS+=("$!")
ADAPTER_PID=$!

k apply --server-side -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: keda-metrics-apiserver, namespace: $NS}
spec:
  type: ExternalName
  externalName: localhost
  ports: [{name: https, port: $ADAPTER_PORT}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.external.metrics.k8s.io}
spec:
  group: external.metrics.k8s.io
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  insecureSkipTLSVerify: true
  service: {name: keda-metrics-apiserver, namespace: $NS, port: $ADAPTER_PORT}
YAML
apiservice_available() {
  kill -0 "$ADAPTER_PID" 2>/dev/null || fail "keda-adapter exited (see $WORK/adapter.log)"
  [[ "$(k get apiservice v1beta1.external.metrics.k8s.io \
    -o jsonpath='{.status.conditions[?(@.type=="Available")].status}' 2>/dev/null)" == True ]]
}
until_true 90 "keda-adapter on 127.0.0.1:$ADAPTER_PORT serves APIService v1beta1.external.metrics.k8s.io (Available)" \
  apiservice_available
k get --raw /apis/external.metrics.k8s.io/v1beta1 >/dev/null \
  || fail "GET /apis/external.metrics.k8s.io/v1beta1 through the API server failed"
ok "the API server proxies external.metrics.k8s.io to the adapter"
