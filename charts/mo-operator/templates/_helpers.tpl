{{- define "mo-operator.labels" -}}
app.kubernetes.io/name: mo-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}
