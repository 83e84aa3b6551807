{{/* The release's resource names: the release name (one release per topology). */}}
{{- define "grudge-stream.fullname" -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "grudge-stream.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "grudge-stream.labels" -}}
{{ include "grudge-stream.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
grudge-stream/topology: {{ .Values.topology | replace "." "-" | replace "_" "-" | trunc 63 | quote }}
{{- end -}}

{{- define "grudge-stream.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "grudge-stream.scheme" -}}
{{ if .Values.webTls.existingSecret }}HTTPS{{ else }}HTTP{{ end }}
{{- end -}}

{{/*
Memory requests (MiB) of one worker holding 8 partitions, per topology and runtime: the measured
peak RSS (`benchmarks/bench_rss.py --sizing`, 3M events over 100k keys; docs/operations.md
"Sizing") rounded up to 32 MiB, plus 64 MiB. The limit is twice the request: the peak grows with
the key count (measured up to +55% at 10M keys) and a snapshot copy may be in flight. Above 8
partitions, each further partition adds its sketch memory to the request (twice to the limit).
*/}}
{{- define "grudge-stream.sizing" -}}
{{- $sizes := dict
  "abuse_scores" (dict "batch" 480 "faust" 352 "perPartition" 13)
  "rate_limit" (dict "batch" 608 "faust" 416 "perPartition" 7)
  "heavy_hitters" (dict "batch" 416 "faust" 224 "perPartition" 2)
  "heavy_global" (dict "batch" 128 "faust" 160 "perPartition" 1)
  "dedup" (dict "batch" 416 "faust" 288 "perPartition" 4)
  "known_keys" (dict "batch" 512 "faust" 320 "perPartition" 4)
-}}
{{- $row := get $sizes .Values.topology | default (get $sizes "abuse_scores") -}}
{{- $extra := 0 -}}
{{- if gt (int .Values.partitions) 8 -}}
{{- $extra = mul (sub (int .Values.partitions) 8) (int (get $row "perPartition")) -}}
{{- end -}}
{{- $request := add (int (get $row .Values.runtime)) $extra -}}
requests:
  cpu: "1"
  memory: {{ printf "%dMi" $request }}
limits:
  memory: {{ printf "%dMi" (mul $request 2) }}
{{- end -}}
