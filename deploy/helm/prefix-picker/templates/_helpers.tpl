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

{{- define "prefix-picker.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
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
{{- if and (eq .Values.mode "sidecar") .Values.modelServers.headlessService.create (not .Values.modelServers.matchLabels) }}
{{- fail "modelServers.matchLabels must be set to create the headless models Service" }}
{{- end }}
{{- end }}
