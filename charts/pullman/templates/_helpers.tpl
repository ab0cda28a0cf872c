{{/* Name of the chart, overridable. */}}
{{- define "pullman.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name: <release>-pullman, or <release> when it already says pullman. */}}
{{- define "pullman.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "pullman.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "pullman.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "pullman.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector of the server pods. */}}
{{- define "pullman.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pullman.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{/* Selector of the `helm test` pods (its NetworkPolicy selects them). */}}
{{- define "pullman.testSelectorLabels" -}}
app.kubernetes.io/name: {{ include "pullman.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
{{- end -}}

{{/* Selector of the agent pods (agent mode). */}}
{{- define "pullman.agentSelectorLabels" -}}
app.kubernetes.io/name: {{ include "pullman.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "pullman.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pullman.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "pullman.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "pullman.adminSecretName" -}}
{{- default (printf "%s-admin-token" (include "pullman.fullname" .)) .Values.adminToken.existingSecret -}}
{{- end -}}

{{- define "pullman.databaseSecretName" -}}
{{- default (printf "%s-database" (include "pullman.fullname" .)) .Values.database.existingSecret -}}
{{- end -}}

{{- define "pullman.databaseSecretKey" -}}
{{- if .Values.database.existingSecret -}}{{ .Values.database.secretKey }}{{- else -}}uri{{- end -}}
{{- end -}}

{{- define "pullman.leaseName" -}}
{{- default (printf "%s-leader" (include "pullman.fullname" .)) .Values.server.leaderElection.id -}}
{{- end -}}

{{- define "pullman.executorServerUrl" -}}
{{- default (printf "http://%s.%s.svc:%d" (include "pullman.fullname" .) .Release.Namespace (int .Values.service.port)) .Values.server.executorServerUrl -}}
{{- end -}}

{{/* Checks that combinations of values make sense; fails with a message naming the value. */}}
{{- define "pullman.validate" -}}
{{- if hasKey .Values "crds" -}}
{{- fail "crds.enabled and crds.keep were removed: the CRDs are in the chart's crds/ directory, which Helm installs before everything else and never deletes or upgrades (chart README, \"CRDs\"). Drop `crds` from your values; to not install the CRDs, pass --skip-crds (Argo CD: skipCrds, Flux: install.crds: Skip). A release installed with crds.keep=false: first `kubectl annotate crd workorders.pullman.dev executors.pullman.dev helm.sh/resource-policy=keep`, or this upgrade deletes the CRDs and every WorkOrder and Executor" -}}
{{- end -}}
{{- if eq .Values.mode "server" -}}
{{- if and (not .Values.database.existingSecret) (not .Values.database.url) -}}
{{- fail "database: set database.existingSecret (a Secret with the PostgreSQL URL under database.secretKey, e.g. a CloudNativePG <cluster>-app Secret) or database.url" -}}
{{- end -}}
{{- if le (int .Values.server.terminationGracePeriodSeconds) (add (int .Values.server.shutdownDelaySeconds) 10) -}}
{{- fail (printf "server.terminationGracePeriodSeconds (%d) must exceed server.shutdownDelaySeconds (%d) + 10, the longest drain of requests in flight: the pod would be killed mid-shutdown" (int .Values.server.terminationGracePeriodSeconds) (int .Values.server.shutdownDelaySeconds)) -}}
{{- end -}}
{{- if and .Values.monitoring.serviceMonitor.enabled .Values.monitoring.podMonitor.enabled -}}
{{- fail "monitoring: enable monitoring.serviceMonitor or monitoring.podMonitor, not both (each replica would be scraped twice)" -}}
{{- end -}}
{{- range .Values.executors -}}
{{- if not .rules -}}
{{- fail (printf "executors[%s]: list the RBAC rules the executor needs in its target namespace (executors[].rules)" .name) -}}
{{- end -}}
{{- $ns := default $.Release.Namespace .namespace -}}
{{- if and $.Values.watchNamespaces (not (has $ns $.Values.watchNamespaces)) -}}
{{- fail (printf "executors[%s]: namespace %s is not in watchNamespaces, so no controller would reconcile it" .name $ns) -}}
{{- end -}}
{{- if and .keda (.keda).enabled -}}
{{- if hasKey . "replicas" -}}
{{- fail (printf "executors[%s]: set replicas or keda.enabled, not both: KEDA scales the executor Deployment, and an Executor with replicas has the controller keep its own count (the two would fight)" .name) -}}
{{- end -}}
{{- if lt (int (.keda.maxReplicas | default 5)) (int (.keda.minReplicas | default 0)) -}}
{{- fail (printf "executors[%s]: keda.maxReplicas is below keda.minReplicas" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- if not .Values.agent.serverUrl -}}
{{- fail "mode=agent: set agent.serverUrl to the central Pullman API (e.g. https://pullman.example.com)" -}}
{{- end -}}
{{- if not .Values.agent.tokenSecret.name -}}
{{- fail "mode=agent: set agent.tokenSecret.name to an existing Secret holding the agent's token (key agent.tokenSecret.key)" -}}
{{- end -}}
{{- if .Values.executors -}}
{{- fail "mode=agent: executors are declared on the central server's release, not on an agent's" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Container resources with empty values left out (`limits.cpu: ""` means no CPU limit; the API
server refuses an empty quantity). Argument: a resources object from values. */}}
{{- define "pullman.resources" -}}
{{- $out := dict -}}
{{- range $section, $quantities := . -}}
{{- $kept := dict -}}
{{- range $name, $q := $quantities -}}
{{- if and (not (kindIs "invalid" $q)) (ne (toString $q) "") -}}
{{- $_ := set $kept $name $q -}}
{{- end -}}
{{- end -}}
{{- if $kept -}}{{- $_ := set $out $section $kept -}}{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* Pod affinity: server.affinity, plus a pod anti-affinity over the given pods when there is more
than one replica (server.podAntiAffinity), unless server.affinity brings its own. Two replicas of
the leader-elected server on one node would both go with that node. Argument: dict with root
(the chart context), replicas and selector (labels of the pods to keep apart). */}}
{{- define "pullman.affinity" -}}
{{- $v := .root.Values.server -}}
{{- $affinity := deepCopy $v.affinity -}}
{{- if and (gt (int .replicas) 1) (ne $v.podAntiAffinity "none") (not (hasKey $affinity "podAntiAffinity")) -}}
{{- $term := dict "topologyKey" $v.podAntiAffinityTopologyKey "labelSelector" (dict "matchLabels" .selector) -}}
{{- if eq $v.podAntiAffinity "hard" -}}
{{- $_ := set $affinity "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) -}}
{{- else -}}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) -}}
{{- end -}}
{{- end -}}
{{- with $affinity }}{{ toYaml . }}{{ end -}}
{{- end -}}
