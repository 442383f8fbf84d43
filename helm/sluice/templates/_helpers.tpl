{{/*
Chart name, truncated to the 63 characters a DNS label allows.
*/}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full resource name: release-chart, or the release name alone when it already contains
the chart name. Truncated to 63 characters; leaves room for the "-headless" suffix.
*/}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 54 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart label value: name-version.
*/}}
{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels that select the pods. Never change these: a Deployment's selector is immutable.
*/}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels on every object.
*/}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" . }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sluice
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
ServiceAccount name.
*/}}
{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Container image reference; a digest wins over the tag.
*/}}
{{- define "sluice.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
Name of the ConfigMap holding the rules: the user's, or the one this chart creates.
*/}}
{{- define "sluice.rulesConfigMapName" -}}
{{- if .Values.rules.existingConfigMap }}
{{- .Values.rules.existingConfigMap }}
{{- else }}
{{- printf "%s-rules" (include "sluice.fullname" .) }}
{{- end }}
{{- end }}

{{/*
Name of the Secret holding the Redis password: the user's, or the one this chart
creates from redis.auth.password. Empty when Redis has no auth.
*/}}
{{- define "sluice.redisSecretName" -}}
{{- if .Values.redis.auth.existingSecret }}
{{- .Values.redis.auth.existingSecret }}
{{- else if .Values.redis.auth.password }}
{{- printf "%s-redis" (include "sluice.fullname" .) }}
{{- end }}
{{- end }}

{{/*
Key of the Redis password in that Secret.
*/}}
{{- define "sluice.redisSecretKey" -}}
{{- if .Values.redis.auth.existingSecret }}
{{- .Values.redis.auth.existingSecretKey }}
{{- else }}
{{- "redis-password" }}
{{- end }}
{{- end }}

{{/*
terminationGracePeriodSeconds: longer than the preStop sleep plus sluice's own drain
(SHUTDOWN_GRACE), so the kubelet never kills sluice before its final Redis flush.
An explicit value that is not longer fails the render.
*/}}
{{- define "sluice.terminationGracePeriodSeconds" -}}
{{- $drain := add (int .Values.preStopSleepSeconds) (int .Values.config.shutdownGraceSeconds) }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $drain 10 }}
{{- else }}
{{- $grace := int .Values.terminationGracePeriodSeconds }}
{{- if le $grace $drain }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be longer than preStopSleepSeconds + config.shutdownGraceSeconds (%d), or sluice is killed before it drains and flushes its counts" $grace $drain) }}
{{- end }}
{{- $grace }}
{{- end }}
{{- end }}

{{/*
DNS name of the Service Envoy should call: the headless one when it exists, so a
STRICT_DNS cluster sees every pod.
*/}}
{{- define "sluice.rlsHost" -}}
{{- $svc := include "sluice.fullname" . }}
{{- if .Values.service.headless }}
{{- $svc = printf "%s-headless" $svc }}
{{- end }}
{{- printf "%s.%s.svc.%s" $svc .Release.Namespace .Values.istio.envoyFilter.clusterDomain }}
{{- end }}

{{/*
Name of the cluster the Envoy rate-limit filter calls.
*/}}
{{- define "sluice.rlsClusterName" -}}
{{- if eq .Values.istio.envoyFilter.cluster "mesh" }}
{{- printf "outbound|%d||%s.%s.svc.%s" (int .Values.service.grpcPort) (include "sluice.fullname" .) .Release.Namespace .Values.istio.envoyFilter.clusterDomain }}
{{- else }}
{{- .Values.istio.envoyFilter.clusterName }}
{{- end }}
{{- end }}

{{/*
Port of that DNS name: pod IPs (headless) answer on the container port.
*/}}
{{- define "sluice.rlsPort" -}}
{{- if .Values.service.headless }}
{{- int .Values.containerPorts.grpc }}
{{- else }}
{{- int .Values.service.grpcPort }}
{{- end }}
{{- end }}

{{/*
An HTTP probe on the http port. Call with (list path probeValues).
*/}}
{{- define "sluice.httpProbe" -}}
{{- $path := index . 0 }}
{{- $p := index . 1 -}}
httpGet:
  path: {{ $path }}
  port: http
initialDelaySeconds: {{ $p.initialDelaySeconds }}
periodSeconds: {{ $p.periodSeconds }}
timeoutSeconds: {{ $p.timeoutSeconds }}
failureThreshold: {{ $p.failureThreshold }}
successThreshold: {{ $p.successThreshold | default 1 }}
{{- end }}

{{/*
Workload selector labels of the EnvoyFilter (YAML): the values', or the default ingress
gateway's for the GATEWAY context.
*/}}
{{- define "sluice.envoyFilterSelector" -}}
{{- $ef := .Values.istio.envoyFilter }}
{{- if $ef.workloadSelector }}
{{- toYaml $ef.workloadSelector }}
{{- else if eq $ef.context "GATEWAY" }}
{{- toYaml (dict "istio" "ingressgateway") }}
{{- end }}
{{- end }}
