{{/* The chart's name, or nameOverride. */}}
{{- define "valve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Objects' names: the release name, with the chart's name unless it holds it already. */}}
{{- define "valve.fullname" -}}
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

{{- define "valve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "valve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "valve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "valve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Seconds Kubernetes waits after SIGTERM before SIGKILL: the drain delay, the graceful
timeout, then valve's own 3 s between SIGTERM and SIGKILL to its workers, plus a margin. */}}
{{- define "valve.terminationGracePeriod" -}}
{{- if .Values.terminationGracePeriodSeconds }}
{{- .Values.terminationGracePeriodSeconds }}
{{- else }}
{{- add .Values.valve.drainDelay .Values.valve.gracefulTimeout 3 .Values.terminationMarginSeconds }}
{{- end }}
{{- end }}

{{/* The PromQL that KEDA (and people) ask: the sum over this release's pods of each pod's
most saturated app. KEDA divides it by the threshold to get the replicas wanted. */}}
{{- define "valve.saturationQuery" -}}
{{- if .Values.keda.query }}
{{- .Values.keda.query }}
{{- else }}
{{- $matchers := printf "namespace=%q,pod=~%q" .Release.Namespace (printf "%s-.*" (include "valve.fullname" .)) }}
{{- if .Values.autoscaling.app }}
{{- $matchers = printf "%s,app=%q" $matchers .Values.autoscaling.app }}
{{- end }}
{{- printf "sum(max by (pod) (valve_saturation{%s}))" $matchers }}
{{- end }}
{{- end }}
