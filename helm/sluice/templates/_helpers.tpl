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
Container image reference; a digest wins over the tag. No public image is published, so
image.repository has no default: an unset one fails the render here, saying what to do,
rather than an install that ends in ImagePullBackOff.
*/}}
{{- define "sluice.image" -}}
{{- $repo := required "image.repository is not set, and no public sluice image exists: build and push one (docker build --build-arg SLUICE_COMMIT=$(git rev-parse --short=12 HEAD) -t REGISTRY/sluice:TAG . && docker push REGISTRY/sluice:TAG), or use the one the release workflow pushes to ghcr.io, then install with --set image.repository=REGISTRY/sluice --set image.tag=TAG (see helm/sluice/README.md)" .Values.image.repository }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion) }}
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

{{/*
The quota filter (envoy.filters.http.rate_limit_quota) of the EnvoyFilter: one gRPC stream to
sluice's quota service (RLQS), each request decided by the proxy from the assignment of its
bucket. The bucket id: istio.envoyFilter.quota.bucketHeaders (key: request header) and
bucketValues (key: fixed value). With headers, only requests that carry all of them are in a
bucket (the others are allowed and not reported); without, every request is in the one bucket.
*/}}
{{- define "sluice.quotaFilter" -}}
{{- $ef := .Values.istio.envoyFilter -}}
{{- $q := $ef.quota -}}
{{- if not (or $q.bucketHeaders $q.bucketValues) -}}
{{- fail "istio.envoyFilter.quota: a bucket id needs bucketHeaders or bucketValues" -}}
{{- end -}}
{{- $builder := dict -}}
{{- range $key, $header := $q.bucketHeaders -}}
{{- $_ := set $builder $key (dict "custom_value" (dict "name" $header "typed_config" (dict "@type" "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput" "header_name" $header))) -}}
{{- end -}}
{{- range $key, $value := $q.bucketValues -}}
{{- $_ := set $builder $key (dict "string_value" $value) -}}
{{- end -}}
{{- $fallback := dict "expired_assignment_behavior_timeout" $q.expiredTimeout "fallback_rate_limit" ($q.expiredFallback | default (dict "blanket_rule" "ALLOW_ALL")) -}}
{{- $deny := dict "http_status" (dict "code" (int $q.denyStatus)) -}}
{{- $settings := dict "@type" "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings" "bucket_id_builder" (dict "bucket_id_builder" $builder) "reporting_interval" $q.reportingInterval "no_assignment_behavior" (dict "fallback_rate_limit" (dict "blanket_rule" $q.noAssignment)) "expired_assignment_behavior" $fallback "deny_response_settings" $deny -}}
{{- $action := dict "action" (dict "name" "sluice_quota_bucket" "typed_config" $settings) -}}
{{- $predicates := list -}}
{{- range $key, $header := $q.bucketHeaders -}}
{{- $input := dict "name" $header "typed_config" (dict "@type" "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput" "header_name" $header) -}}
{{- $predicates = append $predicates (dict "single_predicate" (dict "input" $input "value_match" (dict "safe_regex" (dict "google_re2" (dict) "regex" ".+")))) -}}
{{- end -}}
{{- $matchers := dict -}}
{{- if eq (len $predicates) 0 -}}
{{- $matchers = dict "on_no_match" $action -}}
{{- else if eq (len $predicates) 1 -}}
{{- $matchers = dict "matcher_list" (dict "matchers" (list (dict "predicate" (first $predicates) "on_match" $action))) -}}
{{- else -}}
{{- $matchers = dict "matcher_list" (dict "matchers" (list (dict "predicate" (dict "and_matcher" (dict "predicate" $predicates)) "on_match" $action))) -}}
{{- end -}}
name: envoy.filters.http.rate_limit_quota
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
  domain: {{ $ef.domain | quote }}
  rlqs_server:
    envoy_grpc:
      cluster_name: {{ include "sluice.rlsClusterName" . | quote }}
      authority: {{ printf "%s.%s.svc.%s" (include "sluice.fullname" .) .Release.Namespace $ef.clusterDomain | quote }}
  bucket_matchers:
    {{- toYaml $matchers | nindent 4 }}
{{- end }}
