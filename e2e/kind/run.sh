#!/usr/bin/env bash
# End-to-end on kind (for machines with Docker): builds the image, creates a cluster, installs
# Pullman from config/, registers an Executor running in the cluster, applies the pi WorkOrder and
# waits until its status is Succeeded. The same scenario runs without Docker in
# tests/k8s_executor.rs (end_to_end_kubectl_apply_to_succeeded_with_the_binaries) against
# e2e/testenv.
set -euo pipefail
cd "$(dirname "$0")/../.."
CLUSTER=${CLUSTER:-pullman}
IMAGE=ghcr.io/pullman-dev/pullman:latest

kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

kubectl apply -f e2e/kind/postgres.yaml
kubectl apply -k config/
kubectl -n pullman-system rollout status deploy/pullman-postgres --timeout=180s
kubectl -n pullman-system rollout status deploy/pullman --timeout=180s

# An executor in its own namespace, allowed to manage Jobs there.
kubectl create namespace demo --dry-run=client -o yaml | kubectl apply -f -
kubectl -n demo create serviceaccount pullman-executor --dry-run=client -o yaml | kubectl apply -f -
kubectl -n demo create role job-runner --verb=get,list,watch,create,patch,delete --resource=jobs,configmaps \
  --dry-run=client -o yaml | kubectl apply -f -
kubectl -n demo create rolebinding job-runner --role=job-runner --serviceaccount=demo:pullman-executor \
  --dry-run=client -o yaml | kubectl apply -f -
cat <<YAML | kubectl -n demo apply -f -
apiVersion: pullman.dev/v1alpha1
kind: Executor
metadata: {name: demo}
spec:
  labels: [demo]
  leaseSeconds: 60
  deployment: {image: $IMAGE, serviceAccountName: pullman-executor}
YAML
kubectl -n demo apply -f config/samples/workorder-pi-job.yaml
kubectl -n demo wait workorder/pi --for=jsonpath='{.status.phase}'=Succeeded --timeout=600s
kubectl -n demo get workorder pi -o jsonpath='{.status.message}{"\n"}'
