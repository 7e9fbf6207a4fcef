{{/* Names, labels and derived values shared by the templates. */}}

{{- define "prefix-picker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "prefix-picker.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "prefix-picker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prefix-picker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "prefix-picker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "prefix-picker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: endpoint-picker
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "prefix-picker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "prefix-picker.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The namespace of the model-server pods. */}}
{{- define "prefix-picker.discoveryNamespace" -}}
{{- default .Release.Namespace .Values.discovery.kubernetes.namespace }}
{{- end }}

{{/* The label-selector string: discovery.kubernetes.selector, else modelServers.matchLabels. */}}
{{- define "prefix-picker.selector" -}}
{{- if .Values.discovery.kubernetes.selector }}
{{- .Values.discovery.kubernetes.selector }}
{{- else }}
{{- $pairs := list }}
{{- range $k, $v := .Values.modelServers.matchLabels }}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}
{{- end }}

{{/* The picker's ConfigMap: configMapName, else "<fullname>-config". */}}
{{- define "prefix-picker.configMapName" -}}
{{- default (printf "%s-config" (include "prefix-picker.fullname" .)) .Values.configMapName }}
{{- end }}

{{- define "prefix-picker.modelsService" -}}
{{- default (printf "%s-models" (include "prefix-picker.fullname" .)) .Values.modelServers.headlessService.name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The picker's image. No release is published yet, so the chart has no default image:
     without image.repository it fails here, before anything is applied, instead of leaving
     pods in ImagePullBackOff. */}}
{{- define "prefix-picker.image" -}}
{{- $repository := required "image.repository is not set: no prefix-picker release has been published, so the chart has no default image. Build one (scripts/image, or docker build -t REGISTRY/prefix-picker:TAG .), push it to a registry your nodes can pull from, and set image.repository=REGISTRY/prefix-picker (image.tag defaults to the chart's appVersion). Steps: docs/deploy.md#images" .Values.image.repository }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The InferencePool's name (inferencePool.name, else the fullname). */}}
{{- define "prefix-picker.poolName" -}}
{{- default (include "prefix-picker.fullname" .) .Values.inferencePool.name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The picker's `tls` settings: picker.settings.tls, else selfSigned with an InferencePool
     (GIE's picker serves TLS by default and GIE's gateways expect it), else plaintext. */}}
{{- define "prefix-picker.tls" -}}
{{- if hasKey .Values.picker.settings "tls" }}
{{- toYaml .Values.picker.settings.tls }}
{{- else if .Values.inferencePool.create }}
{{- toYaml (dict "mode" "selfSigned") }}
{{- else }}
{{- toYaml (dict "mode" "plaintext") }}
{{- end }}
{{- end }}

{{/* The HTTPRoute's Gateway namespace. */}}
{{- define "prefix-picker.gatewayNamespace" -}}
{{- default .Release.Namespace .Values.httpRoute.gateway.namespace }}
{{- end }}

{{/* The GatewayClass of a Gateway the chart renders: gateway.className, else the provider's. */}}
{{- define "prefix-picker.gatewayClassName" -}}
{{- $defaults := dict "istio" "istio" "envoy-gateway" "eg" "kgateway" "agentgateway" "gke" "gke-l7-regional-external-managed" }}
{{- default (get $defaults .Values.gateway.provider) .Values.gateway.className }}
{{- end }}

{{/* Fails the render on values that would give a broken deployment. */}}
{{- define "prefix-picker.validate" -}}
{{- if not (has .Values.mode (list "sidecar" "standalone")) }}
{{- fail (printf "mode must be sidecar or standalone, got %q" .Values.mode) }}
{{- end }}
{{- if and (not .Values.discovery.kubernetes.inferencePool) (not (include "prefix-picker.selector" .)) }}
{{- fail "discovery.kubernetes.selector (or modelServers.matchLabels) must be set unless discovery.kubernetes.inferencePool is" }}
{{- end }}
{{- if not .Values.discovery.kubernetes.targetPorts }}
{{- fail "discovery.kubernetes.targetPorts must list at least one port" }}
{{- end }}
{{- if not (has .Values.picker.args (list "native" "gie")) }}
{{- fail (printf "picker.args must be native or gie, got %q" .Values.picker.args) }}
{{- end }}
{{- if and (eq .Values.picker.args "gie") (ne .Values.mode "standalone") }}
{{- fail "picker.args: gie needs mode: standalone (GIE's flags bind every address)" }}
{{- end }}
{{- $providers := list "none" "istio" "envoy-gateway" "kgateway" "gke" }}
{{- if not (has .Values.gateway.provider $providers) }}
{{- fail (printf "gateway.provider must be one of %s, got %q" (join ", " $providers) .Values.gateway.provider) }}
{{- end }}
{{- if .Values.inferencePool.create }}
{{- if ne .Values.mode "standalone" }}
{{- fail "inferencePool.create needs mode: standalone (the gateway calls the picker's Service)" }}
{{- end }}
{{- if ne (include "prefix-picker.discoveryNamespace" .) .Release.Namespace }}
{{- fail "inferencePool.create: the pool, its model servers and the picker's Service share the release namespace; leave discovery.kubernetes.namespace empty" }}
{{- end }}
{{- if .Values.discovery.kubernetes.inferencePool }}
{{- fail "inferencePool.create names the pool itself (inferencePool.name); leave discovery.kubernetes.inferencePool empty" }}
{{- end }}
{{- if not .Values.modelServers.matchLabels }}
{{- fail "inferencePool.create needs modelServers.matchLabels (the pool's selector)" }}
{{- end }}
{{- if not (has .Values.inferencePool.failureMode (list "FailClose" "FailOpen")) }}
{{- fail (printf "inferencePool.failureMode must be FailClose or FailOpen, got %q" .Values.inferencePool.failureMode) }}
{{- end }}
{{- end }}
{{- if and .Values.httpRoute.create (not .Values.inferencePool.create) }}
{{- fail "httpRoute.create routes to the chart's InferencePool: set inferencePool.create too" }}
{{- end }}
{{- if and (ne .Values.gateway.provider "none") (not .Values.inferencePool.create) }}
{{- fail "gateway.provider renders objects for the chart's InferencePool: set inferencePool.create too (legacy gateway examples: envoy/istio, envoy/envoy-gateway)" }}
{{- end }}
{{- if and .Values.gateway.create (eq .Values.gateway.provider "none") }}
{{- fail "gateway.create needs gateway.provider (its GatewayClass)" }}
{{- end }}
{{- if hasKey .Values.gateway "accessLog" }}
{{- fail "gateway.accessLog was removed: the InferencePool filters of Istio and Envoy AI Gateway send each response to the picker on the routing stream, which records the completion there (with any number of replicas); the access log only added one entry per request that no replica could claim. Remove gateway.accessLog from your values, and the envoyHttpAls provider from the mesh config or the EnvoyProxy reference from the Gateway (docs/replicas.md)" }}
{{- end }}
{{- with .Values.picker.kvEventsBindPort }}
{{- $port := int . }}
{{- if or (lt $port 1) (gt $port 65535) }}
{{- fail (printf "picker.kvEventsBindPort must be a port (1-65535) or 0 for none, got %v" .) }}
{{- end }}
{{- $kv := $.Values.picker.settings.kvEvents }}
{{- if $kv }}{{ if hasKey $kv "bind" }}
{{- fail "picker.kvEventsBindPort writes picker.settings.kvEvents.bind (tcp://*:<port>) and opens the port; set one of them, not both" }}
{{- end }}{{ end }}
{{- if gt (int $.Values.replicaCount) 1 }}
{{- fail "picker.kvEventsBindPort needs replicaCount: 1: each engine connects to the Service once, which reaches one replica, so the others would never see its events. For several replicas, let each subscribe to every engine's own publisher (discovery.kubernetes.kvEventsPort; docs/kv-events.md#the-shared-socket)" }}
{{- end }}
{{- $taken := list $.Values.picker.grpcPort $.Values.picker.adminPort $.Values.picker.grpcHealthPort $.Values.envoy.port $.Values.envoy.healthPort $.Values.envoy.adminPort }}
{{- range $taken }}
{{- if eq (int .) $port }}
{{- fail (printf "picker.kvEventsBindPort %d is already a port of the pod (picker.grpcPort, picker.adminPort, picker.grpcHealthPort, envoy.port, envoy.healthPort, envoy.adminPort)" $port) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (eq .Values.mode "sidecar") .Values.modelServers.headlessService.create (not .Values.modelServers.matchLabels) }}
{{- fail "modelServers.matchLabels must be set to create the headless models Service" }}
{{- end }}
{{- end }}

{{/* kvcache-aware's Redis variables (Kthena's REDIS_HOST, REDIS_PORT, REDIS_PASSWORD), when set. */}}
{{- define "prefix-picker.redisEnv" -}}
{{- with .Values.kvcacheAware.redis }}
{{- if .host }}
- name: REDIS_HOST
  value: {{ .host | quote }}
- name: REDIS_PORT
  value: {{ .port | quote }}
{{- if .passwordSecret.name }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ .passwordSecret.name | quote }}, key: {{ required "kvcacheAware.redis.passwordSecret.key is required with its name" .passwordSecret.key | quote }}}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
