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

{{/* Memory limit (MiB) = (base + ring + recorder + channel × (payload + overhead)) × (1 + headroom). */}}
{{- define "retry-agent.memoryLimitMiB" -}}
{{- $b := .Values.bounds -}}
{{- $m := .Values.memory -}}
{{- $channel := div (mul $b.channelCapacity (add $b.payloadBytes $m.eventOverheadBytes)) 1048576 -}}
{{- $sum := add $m.baseMiB $b.ringMiB $b.recorderMaxMiB $channel -}}
{{- div (mul $sum (add 100 $m.headroomPercent)) 100 -}}
{{- end -}}
