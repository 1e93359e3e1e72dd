{{/* Chart name, truncated to a DNS label. */}}
{{- define "sandpod.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart unless the release name already contains the chart name. */}}
{{- define "sandpod.fullname" -}}
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

{{- define "sandpod.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object the chart renders. */}}
{{- define "sandpod.labels" -}}
helm.sh/chart: {{ include "sandpod.chart" . }}
{{ include "sandpod.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sandpod
sandpod.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector labels of the API pods (stable across upgrades). */}}
{{- define "sandpod.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sandpod.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sandpod.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sandpod.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository[:tag][@digest] of an image block; tag defaults to appVersion, a digest wins. */}}
{{- define "sandpod.imageRef" -}}
{{- $img := index . 0 }}{{- $root := index . 1 }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default $root.Chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{- define "sandpod.image" -}}
{{- include "sandpod.imageRef" (list .Values.image .) }}
{{- end }}

{{- define "sandpod.executorImage" -}}
{{- include "sandpod.imageRef" (list .Values.executorImage .) }}
{{- end }}

{{/* Secret and key holding SVC_DATABASE_URL; fails when no database is configured. */}}
{{- define "sandpod.databaseSecretName" -}}
{{- if .Values.database.existingSecret }}
{{- .Values.database.existingSecret }}
{{- else if .Values.database.url }}
{{- printf "%s-database" (include "sandpod.fullname" .) }}
{{- else }}
{{- fail "sandpod needs PostgreSQL in a cluster (PGlite is for the embedded default only): set database.url (stored in a chart-owned Secret) or database.existingSecret (with database.existingSecretKey, default \"url\")" }}
{{- end }}
{{- end }}

{{- define "sandpod.databaseSecretKey" -}}
{{- if .Values.database.existingSecret }}{{ .Values.database.existingSecretKey }}{{ else }}url{{ end }}
{{- end }}

{{/*
The SVC_CONFIG file: the user's `config` plus the keys the chart owns. Keys are those of
src/config.ts ConfigSchema (a test parses this with the service's own parseConfig).
*/}}
{{- define "sandpod.config" -}}
{{- $cfg := deepCopy .Values.config }}
{{- $_ := set $cfg "runtime" "kubernetes" }}
{{- $_ := set $cfg "host" "0.0.0.0" }}
{{- $_ := set $cfg "port" 8000 }}
{{- $_ := set $cfg "workspace" "/tmp/sandpod" }}
{{- $_ := set $cfg "docker_image" (include "sandpod.executorImage" .) }}
{{- $_ := set $cfg "container_runtime" .Values.runtimeClass.name }}
{{- $k8s := dict
  "namespace" .Release.Namespace
  "runs_namespace" .Values.runs.namespace
  "instance" .Release.Name
  "runtime_class" .Values.runtimeClass.name
  "executor_image" (include "sandpod.executorImage" .)
  "image_pull_policy" .Values.executorImage.pullPolicy
  "ttl_seconds_after_finished" (int .Values.runs.ttlSecondsAfterFinished)
  "deadline_grace_seconds" (int .Values.runs.deadlineGraceSeconds)
  "watch_job_types" .Values.jobTypes.watch
}}
{{- $_ := set $cfg "kubernetes" $k8s }}
{{- toYaml $cfg }}
{{- end }}

{{/* Labels of run pods this release creates (set by the service's Job builder). */}}
{{- define "sandpod.runPodSelector" -}}
app.kubernetes.io/managed-by: sandpod
sandpod.io/instance: {{ .Release.Name }}
{{- end }}
