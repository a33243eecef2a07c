{{- define "retry-agent.labels" -}}
app.kubernetes.io/name: retry-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
{{- end -}}

{{- define "retry-agent.selector" -}}
app.kubernetes.io/name: retry-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "retry-agent.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* Memory limit (MiB) = (budget + kernel maps) × (1 + headroom). */}}
{{- define "retry-agent.memoryLimitMiB" -}}
{{- $m := .Values.memory -}}
{{- div (mul (add .Values.memoryBudgetMiB $m.kernelMiB) (add 100 $m.headroomPercent)) 100 -}}
{{- end -}}
