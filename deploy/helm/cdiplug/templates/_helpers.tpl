{{/* Names ------------------------------------------------------------------------------------ */}}

{{- define "cdiplug.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cdiplug.fullname" -}}
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

{{/* The service account the daemon runs as (the admission policies name it). */}}
{{- define "cdiplug.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cdiplug.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The user name the API server gives the daemon's requests: what the policies match. */}}
{{- define "cdiplug.username" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "cdiplug.serviceAccountName" . }}
{{- end }}

{{/* The instance name (values.yaml: instance): null gives the release name (a DNS label: a dot
of a release name becomes a dash), "" the default instance. */}}
{{- define "cdiplug.instance" -}}
{{- if kindIs "string" .Values.instance }}{{ .Values.instance }}{{ else }}{{ .Release.Name | replace "." "-" | trunc 63 | trimSuffix "-" }}{{ end }}
{{- end }}

{{- define "cdiplug.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cdiplug.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cdiplug.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "cdiplug.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: cdiplug
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* metadata: (list $ NAME NAMESPACED [ANNOTATIONS]): name, namespace (namespaced objects
only), labels, and commonAnnotations merged with ANNOTATIONS. */}}
{{- define "cdiplug.metadata" -}}
{{- $ctx := index . 0 -}}
name: {{ index . 1 }}
{{- if index . 2 }}
namespace: {{ $ctx.Release.Namespace }}
{{- end }}
labels:
  {{- include "cdiplug.labels" $ctx | nindent 2 }}
{{- $annotations := merge (dict) (gt (len .) 3 | ternary (last .) dict) $ctx.Values.commonAnnotations }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The configuration file's content as JSON: values' config, or the built-in default when it
names no resources (the daemon's own default without --config). */}}
{{- define "cdiplug.config" -}}
{{- $cfg := .Values.config | default dict }}
{{- if or (hasKey $cfg "resources") (hasKey $cfg "configurations") }}
{{- toJson $cfg }}
{{- else }}
{{- merge (dict "resources" (list (dict "name" "example.com/fpga" "backend" "fake" "options" (dict "count" 2)))) $cfg | toJson }}
{{- end }}
{{- end }}

{{/* What the configuration asks of the node and the cluster, as JSON:
  backends      every backend configured (any named configuration)
  dra           [{driver, resource}] one per DRA driver, in order of first appearance
  devicePlugin  some resource is served through the device plugin API
  named         the configuration has named configurations (the daemon reads its Node's label)
  nodeLabels    some configuration writes node labels
  driverRoots   NVIDIA driver_root folders to mount */}}
{{- define "cdiplug.derived" -}}
{{- $cfg := include "cdiplug.config" . | fromJson }}
{{- $sets := list }}
{{- $named := hasKey $cfg "configurations" }}
{{- if $named }}
{{- range $name, $one := $cfg.configurations }}
{{- $labels := $cfg.node_labels | default false }}
{{- if hasKey $one "node_labels" }}{{ $labels = $one.node_labels }}{{ end }}
{{- $sets = append $sets (dict "resources" ($one.resources | default list) "labels" $labels) }}
{{- end }}
{{- else }}
{{- $sets = list (dict "resources" ($cfg.resources | default list) "labels" ($cfg.node_labels | default false)) }}
{{- end }}
{{- $backends := dict }}
{{- $dra := list }}
{{- $drivers := dict }}
{{- $dp := false }}
{{- $nodeLabels := false }}
{{- $roots := dict }}
{{- range $sets }}
{{- if .labels }}{{ $nodeLabels = true }}{{ end }}
{{- range .resources }}
{{- $_ := set $backends .backend true }}
{{- if eq (.api | default "device-plugin") "dra" }}
{{- $parts := splitn "/" 2 .name }}
{{- $driver := printf "%s.%s" (lower $parts._1) $parts._0 }}
{{- if eq .backend "nvidia" }}{{ $driver = printf "%s.cdiplug.%s" (lower $parts._1) $parts._0 }}{{ end }}
{{- if .dra_driver }}{{ $driver = .dra_driver }}{{ end }}
{{- if not (hasKey $drivers $driver) }}
{{- $_ := set $drivers $driver true }}
{{- $dra = append $dra (dict "driver" $driver "resource" .name) }}
{{- end }}
{{- else }}
{{- $dp = true }}
{{- end }}
{{- if and (eq .backend "nvidia") .options }}{{ with .options.driver_root }}{{ $_ := set $roots . true }}{{ end }}{{ end }}
{{- end }}
{{- end }}
{{- dict "backends" (keys $backends | sortAlpha) "dra" $dra "devicePlugin" $dp "named" $named "nodeLabels" $nodeLabels "driverRoots" (keys $roots | sortAlpha) | toJson }}
{{- end }}

{{/* The pod's shape, as JSON: hostNetwork, hostPID, privileged, surge, metricsPort. */}}
{{- define "cdiplug.pod" -}}
{{- $d := include "cdiplug.derived" . | fromJson }}
{{- $pci := has "pci" $d.backends }}
{{- /* The generic backend hears hotplug from udev over netlink, whose events are per network
namespace: only the node's own carries them (elsewhere it finds changes at its rescan). */}}
{{- $hostNetwork := or $pci (has "generic" $d.backends) }}
{{- if not (kindIs "invalid" .Values.hostNetwork) }}{{ $hostNetwork = .Values.hostNetwork }}{{ end }}
{{- /* Surge only with DRA resources alone, and off the host network: two pods of a surge on
the node's network would both need the metrics port (and a declared port is a host port there,
so the scheduler would never place the new pod). */}}
{{- $surge := and (gt (len $d.dra) 0) (not $d.devicePlugin) (not $hostNetwork) }}
{{- $port := int .Values.metrics.port }}
{{- $token := or (gt (len $d.dra) 0) $d.named $d.nodeLabels }}
{{- dict "hostNetwork" $hostNetwork "hostPID" $pci "privileged" $pci "surge" $surge "metricsPort" $port "token" $token | toJson }}
{{- end }}

{{/* The admission webhook's names and labels (never the daemon's selector labels: the DaemonSet
and the metrics Service must not select its pods). */}}
{{- define "cdiplug.webhookName" -}}
{{- printf "%s-webhook" (include "cdiplug.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cdiplug.webhookSelectorLabels" -}}
app.kubernetes.io/name: {{ include "cdiplug.name" . }}-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* metadata of a webhook object: (list $ NAME NAMESPACED). */}}
{{- define "cdiplug.webhookMetadata" -}}
{{- $ctx := index . 0 }}
{{- $meta := include "cdiplug.metadata" . | fromYaml }}
{{- $_ := set $meta "labels" (merge (include "cdiplug.webhookSelectorLabels" $ctx | fromYaml) $meta.labels) }}
{{- toYaml $meta }}
{{- end }}
