{{- define "slipstream.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "slipstream.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "slipstream.labels" -}}
{{ include "slipstream.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "slipstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "slipstream.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}


{{- define "slipstream.peeringName" -}}
{{- default (include "slipstream.fullname" .) .Values.peering.name -}}
{{- end -}}

{{/*
The namespaces served, as JSON: watchNamespaces plus the older single watchNamespace.
Empty: every namespace (a cluster-wide install). Read with `include ... | fromJsonArray`.
*/}}
{{- define "slipstream.watchNamespaces" -}}
{{- $namespaces := list -}}
{{- range .Values.watchNamespaces }}{{ $namespaces = append $namespaces . }}{{ end -}}
{{- with .Values.watchNamespace }}{{ $namespaces = append $namespaces . }}{{ end -}}
{{- toJson ($namespaces | uniq) -}}
{{- end -}}

{{/* The username the apiserver gives the operator's ServiceAccount. */}}
{{- define "slipstream.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "slipstream.serviceAccountName" .) -}}
{{- end -}}
