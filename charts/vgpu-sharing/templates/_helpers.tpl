{{/*
Shared pieces of the templates. Object names are `<prefix>-<part>` (vgpu-scheduler, vgpu-device-plugin,
vgpu-sharing-config, ...): the prefix is `vgpu` unless fullnameOverride or nameOverride set it, and never the
release name by default, so that a default install names its objects as deploy/ does. The objects refer to each
other through "vgpu-sharing.fullname" only. The wire names (DRA driver and DeviceClasses, resource names,
annotations) do not follow the prefix: install one release per cluster.
*/}}

{{/* The prefix of every object name: fullnameOverride; else, with nameOverride, Helm's usual
     <release>-<nameOverride> (the release name alone when it contains nameOverride); else "vgpu". */}}
{{- define "vgpu-sharing.prefix" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if .Values.nameOverride -}}
{{- if contains .Values.nameOverride .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- else -}}
vgpu
{{- end -}}
{{- end -}}

{{/* The name of one of our objects: <prefix>-<part>. Call with (dict "ctx" $ "part" "scheduler"). */}}
{{- define "vgpu-sharing.fullname" -}}
{{- printf "%s-%s" (include "vgpu-sharing.prefix" .ctx) .part -}}
{{- end -}}

{{/* The namespace of every namespaced object: namespaceOverride, else the release namespace. */}}
{{- define "vgpu-sharing.namespace" -}}
{{- .Values.namespaceOverride | default .Release.Namespace -}}
{{- end -}}

{{/* An image reference from a repository and a tag, with global.imageRegistry: put in place of the registry the
     repository names (a first path component with a dot or a colon, or localhost, as in registry.k8s.io/...),
     else in front of it. Call with (dict "ctx" $ "repository" "..." "tag" "..."). */}}
{{- define "vgpu-sharing.imageRef" -}}
{{- $repository := .repository -}}
{{- with .ctx.Values.global.imageRegistry -}}
{{- $registry := trimSuffix "/" . -}}
{{- $parts := splitList "/" $repository -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repository = join "/" (prepend (rest $parts) $registry) -}}
{{- else -}}
{{- $repository = printf "%s/%s" $registry $repository -}}
{{- end -}}
{{- end -}}
{{- printf "%s:%s" $repository .tag -}}
{{- end -}}

{{/* The kube-scheduler image's tag: scheduler.kubeScheduler.image.tag, else the cluster's version as Helm sees it
     (.Capabilities.KubeVersion) without what follows "+" (v1.30.0+k3s1 -> v1.30.0) or a vendor's "-" suffix
     (v1.31.4-eks-1552ad0 -> v1.31.4); upstream pre-releases (-alpha.N, -beta.N, -rc.N) keep theirs. */}}
{{- define "vgpu-sharing.kubeSchedulerTag" -}}
{{- if .Values.scheduler.kubeScheduler.image.tag -}}
{{- .Values.scheduler.kubeScheduler.image.tag -}}
{{- else -}}
{{- $version := first (splitList "+" .Capabilities.KubeVersion.Version) -}}
{{- $release := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" $version -}}
{{- $suffix := trimPrefix $release $version -}}
{{- if regexMatch "^-(alpha|beta|rc)\\.[0-9]+$" $suffix -}}
{{- $release = $version -}}
{{- end -}}
{{- printf "v%s" (trimPrefix "v" $release) -}}
{{- end -}}
{{- end -}}

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

{{/* Our image, [global.imageRegistry/]repository:tag (the tag defaults to the chart's appVersion). */}}
{{- define "vgpu-sharing.image" -}}
{{ include "vgpu-sharing.imageRef" (dict "ctx" . "repository" .Values.image.repository "tag" (.Values.image.tag | default .Chart.AppVersion)) }}
{{- end -}}

{{/* The upstream kube-scheduler image. */}}
{{- define "vgpu-sharing.kubeSchedulerImage" -}}
{{ include "vgpu-sharing.imageRef" (dict "ctx" . "repository" .Values.scheduler.kubeScheduler.image.repository "tag" (include "vgpu-sharing.kubeSchedulerTag" .)) }}
{{- end -}}

{{/* runtimeClassName of a pod spec that reaches GPUs through NVML (argument "name"), or nothing. */}}
{{- define "vgpu-sharing.runtimeClassName" -}}
{{- with .name }}
runtimeClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* imagePullSecrets of a pod spec, or nothing. */}}
{{- define "vgpu-sharing.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The username of one of our ServiceAccounts (argument "part": its name is <prefix>-<part>). */}}
{{- define "vgpu-sharing.serviceAccountUser" -}}
system:serviceaccount:{{ include "vgpu-sharing.namespace" .ctx }}:{{ include "vgpu-sharing.fullname" . }}
{{- end -}}

{{/* The ConfigMap the device plugins read the grant public keys from. */}}
{{- define "vgpu-sharing.publicKeysConfigMap" -}}
{{- if .Values.grantKey.publicKeys -}}
{{ include "vgpu-sharing.fullname" (dict "ctx" . "part" "grant-public-keys") }}
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
{{- .Values.scheduler.extender.tls.existingSecret | default (include "vgpu-sharing.fullname" (dict "ctx" . "part" "scheduler-extender-tls")) -}}
{{- end -}}

{{/* The Secret holding the webhook's serving certificate. */}}
{{- define "vgpu-sharing.webhookTLSSecret" -}}
{{- .Values.webhook.tls.existingSecret | default (include "vgpu-sharing.fullname" (dict "ctx" . "part" "webhook-tls")) -}}
{{- end -}}

{{/* The webhook's namespaceSelector: the namespaces always excluded (the control plane's, ours and
     webhook.excludeNamespaces) as one NotIn expression, with webhook.namespaceSelector's matchLabels and
     matchExpressions added (all must hold). */}}
{{- define "vgpu-sharing.webhookNamespaceSelector" -}}
{{- $excluded := concat (list "kube-system" "kube-public" "kube-node-lease" (include "vgpu-sharing.namespace" .)) .Values.webhook.excludeNamespaces | uniq -}}
{{- $expressions := list (dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" $excluded) -}}
{{- $extra := .Values.webhook.namespaceSelector | default dict -}}
{{- $expressions = concat $expressions ($extra.matchExpressions | default list) -}}
{{- $selector := dict "matchExpressions" $expressions -}}
{{- with $extra.matchLabels -}}
{{- $_ := set $selector "matchLabels" . -}}
{{- end -}}
{{- toYaml $selector -}}
{{- end -}}

{{/* devicePlugin.nodeConfiguration as the file `vgpu device-plugin --node-config` reads (nodeConfig: [...]). */}}
{{- define "vgpu-sharing.nodeConfigurationFile" -}}
{{- toYaml (dict "nodeConfig" .Values.devicePlugin.nodeConfiguration) -}}
{{- end -}}

{{/*
A CA and a certificate signed by it, as the base64 data of a kubernetes.io/tls Secret (JSON: tls.crt, tls.key,
ca.crt). The Secret of that name in the release namespace is reused when it holds all three (Helm's lookup, on
install and upgrade against a cluster), so an upgrade keeps the CA that clients already trust; offline renders
(`helm template`) always generate. ECDSA P-256 keys; genSignedCertWithKey gives the certificate both the server and
the client extended key usage. Arguments: ctx, secret, cn, dns (list), ips (list), days.
*/}}
{{- define "vgpu-sharing.tlsData" -}}
{{- $existing := lookup "v1" "Secret" (include "vgpu-sharing.namespace" .ctx) .secret -}}
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
{{- $nodes := list -}}
{{- range $i, $entry := .Values.devicePlugin.nodeConfiguration -}}
{{- if has $entry.name $nodes -}}
{{- fail (printf "vgpu-sharing: devicePlugin.nodeConfiguration[%d]: node %s has two entries; merge them into one" $i $entry.name) -}}
{{- end -}}
{{- $nodes = append $nodes $entry.name -}}
{{- if and (hasKey $entry "memoryScaling") (ne (toString $entry.memoryScaling) "1") (ne (toString $entry.memoryScaling) "1.0") -}}
{{- fail (printf "vgpu-sharing: devicePlugin.nodeConfiguration[%d] (node %s): memoryScaling %v is not supported: vgpu-sharing never oversubscribes device memory (the grants on a GPU add up to at most its memory); remove it or set 1" $i $entry.name $entry.memoryScaling) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.devicePlugin.createRuntimeClass (not .Values.devicePlugin.runtimeClassName) -}}
{{- fail "vgpu-sharing: devicePlugin.createRuntimeClass needs devicePlugin.runtimeClassName, the name of the RuntimeClass to create (e.g. nvidia)" -}}
{{- end -}}
{{- with .Values.grantKey.publicKeys -}}
{{- if contains "PRIVATE KEY" . -}}
{{- fail "vgpu-sharing: grantKey.publicKeys holds a private key; give the public key (openssl pkey -in grant.key -pubout): a device plugin given a private key refuses to start" -}}
{{- end -}}
{{- end -}}
{{- end -}}
