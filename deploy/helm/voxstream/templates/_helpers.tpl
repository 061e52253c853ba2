{{- define "voxstream.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "voxstream.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "voxstream.labels" -}}
{{ include "voxstream.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "voxstream.voicesClaim" -}}
{{- if .Values.voices.existingClaim -}}
{{- .Values.voices.existingClaim -}}
{{- else if .Values.voices.create.enabled -}}
{{- printf "%s-voices" (include "voxstream.fullname" .) -}}
{{- end -}}
{{- end -}}
