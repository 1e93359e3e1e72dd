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

{{/* imagePullPolicy of an image block: its pullPolicy, or "" → IfNotPresent with a digest, Always with a tag. */}}
{{- define "sandpod.pullPolicy" -}}
{{- if .pullPolicy }}{{ .pullPolicy }}{{ else if .digest }}IfNotPresent{{ else }}Always{{ end }}
{{- end }}

{{- define "sandpod.image" -}}
{{- include "sandpod.imageRef" (list .Values.image .) }}
{{- end }}

{{- define "sandpod.executorImage" -}}
{{- include "sandpod.imageRef" (list .Values.executorImage .) }}
{{- end }}

{{/* Secret and key holding SVC_DATABASE_URL; fails when no database is configured. */}}
{{- define "sandpod.databaseSecretName" -}}
{{- if .Values.postgresql.enabled }}
{{- include "sandpod.trialDbName" . }}
{{- else if .Values.database.existingSecret }}
{{- .Values.database.existingSecret }}
{{- else if .Values.database.url }}
{{- printf "%s-database" (include "sandpod.fullname" .) }}
{{- else }}
{{- fail "sandpod needs PostgreSQL in a cluster (PGlite is for the embedded default only): set database.url (stored in a chart-owned Secret) or database.existingSecret (with database.existingSecretKey, default \"url\"), or postgresql.enabled=true for a trial database (not for production)" }}
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
  "image_pull_policy" (include "sandpod.pullPolicy" .Values.executorImage)
  "ttl_seconds_after_finished" (int .Values.runs.ttlSecondsAfterFinished)
  "deadline_grace_seconds" (int .Values.runs.deadlineGraceSeconds)
  "watch_job_types" .Values.jobTypes.watch
  "preflight" .Values.runs.preflight
  "runtime_class_network_none" (ternary .Values.runtimeClass.networkNone.name nil .Values.runtimeClass.networkNone.enabled)
  "network_check_service" (ternary (include "sandpod.fullname" .) nil (and .Values.runs.preflight .Values.runs.networkCheck))
  "cpu_request_fraction" (float64 .Values.runs.requests.cpuFraction)
  "memory_request_fraction" (float64 .Values.runs.requests.memoryFraction)
  "warm_pool_size" (int .Values.runs.warmPool.size)
  "warm_pool_max_idle_seconds" (int .Values.runs.warmPool.maxIdleSeconds)
  "cold_start" .Values.runs.coldStart
  "api_timeout_seconds" (int .Values.runs.apiTimeoutSeconds)
  "watch_timeout_seconds" (int .Values.runs.watchTimeoutSeconds)
}}
{{- with .Values.leaderElection }}
{{- $_ := set $k8s "leader_election" (dict "enabled" .enabled "lease_name" (printf "%s-leader" (include "sandpod.fullname" $) | trunc 63 | trimSuffix "-") "lease_duration_seconds" (int .leaseDurationSeconds) "renew_deadline_seconds" (int .renewDeadlineSeconds) "retry_period_seconds" .retryPeriodSeconds) }}
{{- end }}
{{- if .Values.egressProxy.enabled }}
{{- $_ := set $k8s "egress_proxy" (dict "url" (include "sandpod.egressProxy.url" .) "key_file" "/etc/sandpod/egress/key") }}
{{- end }}
{{- with .Values.builds }}
{{- $_ := set $k8s "build_registry" (ternary .registry nil (ne .registry "")) }}
{{- $_ := set $k8s "build_registry_secret" (ternary .registrySecret nil (ne .registrySecret "")) }}
{{- $_ := set $k8s "build_registry_insecure" .insecure }}
{{- $_ := set $k8s "build_platform" .platform }}
{{- $_ := set $k8s "build_cpu" (toString .resources.cpu) }}
{{- $_ := set $k8s "build_memory" .resources.memory }}
{{- $_ := set $k8s "build_ephemeral_storage" .resources.ephemeralStorage }}
{{- end }}
{{- $_ := set $cfg "kubernetes" $k8s }}
{{- if kindIs "map" .Values.runs.warmPool.sessionSizes }}
{{- $_ := set $cfg "warm_pool" (dict "session_sizes" .Values.runs.warmPool.sessionSizes) }}
{{- end }}
{{- with .Values.webhooks }}
{{- if .enabled }}
{{- $_ := set $cfg "webhooks" (dict
  "allowed_hosts" .allowedHosts
  "allow_private_addresses" .allowPrivateAddresses
  "default_callback_url" (ternary .defaultCallbackUrl nil (ne .defaultCallbackUrl ""))
  "max_attempts" (int .maxAttempts)
  "max_age_seconds" (int .maxAgeSeconds)
  "base_delay_seconds" (int .baseDelaySeconds)
  "timeout_seconds" (int .timeoutSeconds)
  "secrets_file" "/etc/sandpod/webhooks/secrets") }}
{{- end }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* Labels of run pods this release creates (set by the service's Job builder). */}}
{{- define "sandpod.runPodSelector" -}}
app.kubernetes.io/managed-by: sandpod
sandpod.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Secret and key holding the API tokens (auth.enabled). */}}
{{- define "sandpod.authSecretName" -}}
{{- default (printf "%s-api-tokens" (include "sandpod.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{- define "sandpod.authSecretKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.existingSecretKey }}{{ else }}tokens{{ end }}
{{- end }}

{{/* The trial PostgreSQL (postgresql.enabled): its name (Secret, Service, StatefulSet) and selector. */}}
{{- define "sandpod.trialDbName" -}}
{{- printf "%s-postgresql" (include "sandpod.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Secret and key of the trial database's password: postgresql.existingSecret, or the generated one. */}}
{{- define "sandpod.trialDbSecretName" -}}
{{- default (include "sandpod.trialDbName" .) .Values.postgresql.existingSecret }}
{{- end }}

{{- define "sandpod.trialDbSecretKey" -}}
{{- if .Values.postgresql.existingSecret }}{{ .Values.postgresql.existingSecretKey }}{{ else }}password{{ end }}
{{- end }}

{{- define "sandpod.trialDbSelectorLabels" -}}
app.kubernetes.io/name: {{ include "sandpod.name" . }}-postgresql
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The egress proxy: its objects' name, the key Secret, and labels distinct from the API pods'. */}}
{{- define "sandpod.egressProxy.fullname" -}}
{{- printf "%s-egress-proxy" (include "sandpod.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sandpod.egressProxy.secretName" -}}
{{- default (printf "%s-egress-key" (include "sandpod.fullname" .) | trunc 63 | trimSuffix "-") .Values.egressProxy.existingSecret }}
{{- end }}

{{- define "sandpod.egressProxy.secretKey" -}}
{{- if .Values.egressProxy.existingSecret }}{{ .Values.egressProxy.existingSecretKey }}{{ else }}key{{ end }}
{{- end }}

{{- define "sandpod.egressProxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sandpod.name" . }}-egress-proxy
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sandpod.egressProxy.labels" -}}
helm.sh/chart: {{ include "sandpod.chart" . }}
{{ include "sandpod.egressProxy.selectorLabels" . }}
app.kubernetes.io/component: egress-proxy
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sandpod
sandpod.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The proxy URL run pods get (without credentials). */}}
{{- define "sandpod.egressProxy.url" -}}
{{- printf "http://%s.%s.svc.%s:%d" (include "sandpod.egressProxy.fullname" .) .Release.Namespace .Values.egressProxy.clusterDomain (int .Values.egressProxy.port) }}
{{- end }}

{{/* Secret and key holding the webhook signing secrets (webhooks.enabled). */}}
{{- define "sandpod.webhooks.secretName" -}}
{{- default (printf "%s-webhook-secrets" (include "sandpod.fullname" .) | trunc 63 | trimSuffix "-") .Values.webhooks.existingSecret }}
{{- end }}

{{- define "sandpod.webhooks.secretKey" -}}
{{- if .Values.webhooks.existingSecret }}{{ .Values.webhooks.existingSecretKey }}{{ else }}secrets{{ end }}
{{- end }}
