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

{{/* valve's container's security context: .Values.securityContext, and with `isolation`
users or view, root with only what valve needs to give each app a user of its own:
becoming it (SETUID, SETGID), making its private folders its own (CHOWN, FOWNER), reaching
into them, 0700 and the app's (DAC_OVERRIDE), and signalling its workers (KILL). view adds
a mount namespace per app (SYS_ADMIN; AppArmor unconfined: the runtimes' default AppArmor
profiles refuse mounts; seccomp as viewSeccompProfile says). From Kubernetes 1.30 AppArmor is a
field here; before, the pod annotation in the Deployment's template. */}}
{{- define "valve.securityContext" -}}
{{- $sc := deepCopy .Values.securityContext }}
{{- if include "valve.asRoot" . }}
{{- $caps := list "SETUID" "SETGID" "CHOWN" "DAC_OVERRIDE" "FOWNER" "KILL" }}
{{- if eq .Values.isolation "view" }}
{{- $caps = append $caps "SYS_ADMIN" }}
{{- end }}
{{- $_ := set $sc "runAsUser" 0 }}
{{- $_ = set $sc "runAsGroup" 0 }}
{{- $_ = set $sc "runAsNonRoot" false }}
{{- $_ = set $sc "capabilities" (dict "drop" (list "ALL") "add" $caps) }}
{{- if eq .Values.isolation "view" }}
{{- if eq .Values.viewSeccompProfile "Unconfined" }}
{{- $_ = set $sc "seccompProfile" (dict "type" "Unconfined") }}
{{- end }}
{{- if include "valve.appArmorField" . }}
{{- $_ = set $sc "appArmorProfile" (dict "type" "Unconfined") }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml $sc }}
{{- end }}

{{/* Non-empty when the cluster takes AppArmor as a security context field (1.30 and later). */}}
{{- define "valve.appArmorField" -}}
{{- if semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version }}yes{{ end }}
{{- end }}

{{/*
Publishing with more than one pod needs one volume they all mount: a
ReadWriteMany claim made here, or an existing claim (its access mode is the
operator's word). Fails the install otherwise; renders nothing.
*/}}
{{- define "valve.publishingShared" -}}
{{- $p := .Values.publishing -}}
{{- $many := or (gt (int .Values.replicaCount) 1) .Values.autoscaling.hpa.enabled .Values.keda.enabled -}}
{{- $shared := or $p.volume.existingClaim (eq $p.volume.accessMode "ReadWriteMany") -}}
{{- if and $many (not $shared) -}}
{{- fail (printf "publishing.enabled with %s needs a volume every pod mounts: set publishing.volume.accessMode to ReadWriteMany (a storage class that offers it: NFS, CephFS, EFS, Azure Files, Filestore), or publishing.volume.existingClaim to such a claim; or run one replica (replicaCount: 1, no autoscaling). With %s, each pod would serve only what was published through it." (ternary "autoscaling" (printf "replicaCount %d" (int .Values.replicaCount)) (or .Values.autoscaling.hpa.enabled .Values.keda.enabled)) $p.volume.accessMode) -}}
{{- end -}}
{{- end }}

{{/* Non-empty when valve's container runs as root to give apps users of their own (isolation users or view). */}}
{{- define "valve.asRoot" -}}
{{- if has .Values.isolation (list "users" "view") }}yes{{ end }}
{{- end }}
