{{/*
Shared pieces of the templates. Object names are fixed (vgpu-scheduler, vgpu-device-plugin, ...), not derived from
the release name: the admission policies, the scheduler profile and the Volcano/HAMi wire names refer to them, and
several objects are cluster-scoped. Install one release per cluster.
*/}}

{{/* Helm's labels, added to every object's metadata (not to pod templates or selectors, which stay as deploy/'s). */}}
{{- define "vgpu-sharing.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The labels of an object: part-of, the component (argument "component"), Helm's. Call with
     (dict "ctx" $ "component" "scheduler"). */}}
{{- define "vgpu-sharing.labels" -}}
app.kubernetes.io/part-of: vgpu-sharing
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{ include "vgpu-sharing.helmLabels" .ctx }}
{{- end -}}

{{/* Our image, repository:tag (the tag defaults to the chart's appVersion). */}}
{{- define "vgpu-sharing.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* imagePullSecrets of a pod spec, or nothing. */}}
{{- define "vgpu-sharing.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The username of one of our ServiceAccounts (argument "name") in the release namespace. */}}
{{- define "vgpu-sharing.serviceAccountUser" -}}
system:serviceaccount:{{ .ctx.Release.Namespace }}:{{ .name }}
{{- end -}}

{{/* The ConfigMap the device plugins read the grant public keys from. */}}
{{- define "vgpu-sharing.publicKeysConfigMap" -}}
{{- if .Values.grantKey.publicKeys -}}
vgpu-grant-public-keys
{{- else -}}
{{ required "grantKey.existingPublicKeysConfigMap (or grantKey.publicKeys) is required" .Values.grantKey.existingPublicKeysConfigMap }}
{{- end -}}
{{- end -}}

{{/* How HAMi's names are read (vgpu.resources.SharingConfig.hami_mode): off, shared or all; the older
     sharing.hami_aliases: true is all. */}}
{{- define "vgpu-sharing.hamiMode" -}}
{{- if .Values.sharing.hami_aliases -}}all{{- else -}}{{ .Values.sharing.hami_names | default "shared" }}{{- end -}}
{{- end -}}

{{/* The resource names a container may ask for, as a JSON list: sharing.resources (number, memory, memory
     percentage, cores), then HAMi's share names unless hami_names is off, and nvidia.com/gpu with hami_names: all
     (under shared, nvidia.com/gpu alone is a whole GPU of NVIDIA's device plugin). */}}
{{- define "vgpu-sharing.resourceNames" -}}
{{- $r := .Values.sharing.resources -}}
{{- $names := list $r.number $r.memory $r.memory_percentage $r.cores -}}
{{- $mode := include "vgpu-sharing.hamiMode" . -}}
{{- if eq $mode "all" -}}
{{- $names = append $names "nvidia.com/gpu" -}}
{{- end -}}
{{- if ne $mode "off" -}}
{{- $names = concat $names (list "nvidia.com/gpumem" "nvidia.com/gpumem-percentage" "nvidia.com/gpucores") -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{/* What NodeResourcesFit must leave to the extender, as a JSON list: the resource names above and the quota
     totals the webhook writes (vgpu.resources.QUOTA_MEMORY, QUOTA_CORES). */}}
{{- define "vgpu-sharing.managedResources" -}}
{{- concat (include "vgpu-sharing.resourceNames" . | fromJsonArray) (list "volcano.sh/vgpu-memory-total" "volcano.sh/vgpu-cores-total") | uniq | toJson -}}
{{- end -}}

{{/* Whether the extender speaks mutual TLS with kube-scheduler: "true" or "". */}}
{{- define "vgpu-sharing.extenderTLS" -}}
{{- if .Values.scheduler.extender.tls.enabled }}true{{ end -}}
{{- end -}}

{{/* The Secret holding the extender's TLS files. */}}
{{- define "vgpu-sharing.extenderTLSSecret" -}}
{{- .Values.scheduler.extender.tls.existingSecret | default "vgpu-scheduler-extender-tls" -}}
{{- end -}}

{{/* The Secret holding the webhook's serving certificate. */}}
{{- define "vgpu-sharing.webhookTLSSecret" -}}
{{- .Values.webhook.tls.existingSecret | default "vgpu-webhook-tls" -}}
{{- end -}}

{{/*
A CA and a certificate signed by it, as the base64 data of a kubernetes.io/tls Secret (JSON: tls.crt, tls.key,
ca.crt). The Secret of that name in the release namespace is reused when it holds all three (Helm's lookup, on
install and upgrade against a cluster), so an upgrade keeps the CA that clients already trust; offline renders
(`helm template`) always generate. ECDSA P-256 keys; genSignedCertWithKey gives the certificate both the server and
the client extended key usage. Arguments: ctx, secret, cn, dns (list), ips (list), days.
*/}}
{{- define "vgpu-sharing.tlsData" -}}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace .secret -}}
{{- if and $existing $existing.data (index $existing.data "tls.crt") (index $existing.data "tls.key") (index $existing.data "ca.crt") -}}
{{- dict "tls.crt" (index $existing.data "tls.crt") "tls.key" (index $existing.data "tls.key") "ca.crt" (index $existing.data "ca.crt") | toJson -}}
{{- else -}}
{{- $ca := genCAWithKey (printf "%s-ca" .cn) (int .days) (genPrivateKey "ecdsa") -}}
{{- $cert := genSignedCertWithKey .cn .ips .dns (int .days) $ca (genPrivateKey "ecdsa") -}}
{{- dict "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) "ca.crt" ($ca.Cert | b64enc) | toJson -}}
{{- end -}}
{{- end -}}

{{/* Refuse values that would install something broken, with a message naming the values. */}}
{{- define "vgpu-sharing.validate" -}}
{{- if not (or .Values.devicePlugin.enabled .Values.dra.enabled) -}}
{{- fail "vgpu-sharing: devicePlugin.enabled and dra.enabled are both false, so no node would offer GPUs and there is nothing to install; enable at least one of them" -}}
{{- end -}}
{{- if and (gt (int .Values.scheduler.replicas) 1) (not .Values.scheduler.leaderElection.enabled) -}}
{{- fail "vgpu-sharing: scheduler.replicas > 1 needs scheduler.leaderElection.enabled (two schedulers would bind at the same time)" -}}
{{- end -}}
{{- if .Values.webhook.enabled -}}
{{- if and .Values.webhook.certManager.enabled .Values.webhook.tls.existingSecret -}}
{{- fail "vgpu-sharing: webhook.certManager.enabled and webhook.tls.existingSecret are exclusive: choose where the webhook's certificate comes from" -}}
{{- end -}}
{{- if and .Values.webhook.tls.existingSecret (not .Values.webhook.tls.caBundle) -}}
{{- fail "vgpu-sharing: webhook.tls.existingSecret needs webhook.tls.caBundle (the PEM of the CA that signed it), which the API server checks the webhook against" -}}
{{- end -}}
{{- if not .Values.webhook.replaceSchedulerNames -}}
{{- fail "vgpu-sharing: webhook.replaceSchedulerNames is empty: the webhook would rewrite nothing (set webhook.enabled=false instead)" -}}
{{- end -}}
{{- if and .Values.webhook.networkPolicy.enabled (not .Values.webhook.networkPolicy.from) -}}
{{- fail "vgpu-sharing: webhook.networkPolicy.enabled needs webhook.networkPolicy.from, the API server's addresses (e.g. [{ipBlock: {cidr: 10.0.0.10/32}}]); without them no one, the API server included, could reach the webhook" -}}
{{- end -}}
{{- end -}}
{{- with .Values.grantKey.publicKeys -}}
{{- if contains "PRIVATE KEY" . -}}
{{- fail "vgpu-sharing: grantKey.publicKeys holds a private key; give the public key (openssl pkey -in grant.key -pubout): a device plugin given a private key refuses to start" -}}
{{- end -}}
{{- end -}}
{{- end -}}
