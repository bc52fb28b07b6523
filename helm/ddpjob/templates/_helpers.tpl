{{/* Names and labels shared by every template. */}}

{{- define "ddpjob.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-<chart>, or the release name alone when it already contains the chart name. */}}
{{- define "ddpjob.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ddpjob.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ddpjob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ddpjob.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "ddpjob.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "ddpjob.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ddpjob.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "ddpjob.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "ddpjob.trainerImage" -}}
{{- printf "%s:%s" .Values.trainerImage.repository (default .Chart.AppVersion .Values.trainerImage.tag) -}}
{{- end -}}

{{/* The namespaces the operator watches in namespaced mode, as a list. */}}
{{- define "ddpjob.watchedNamespaces" -}}
{{- if .Values.watch.namespaces -}}
{{- toYaml (uniq .Values.watch.namespaces) -}}
{{- else -}}
{{- toYaml (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{/* The namespaces that get the training NetworkPolicy. */}}
{{- define "ddpjob.trainingNamespaces" -}}
{{- if not .Values.watch.clusterWide -}}
{{- include "ddpjob.watchedNamespaces" . -}}
{{- else if .Values.networkPolicy.clusterWideNamespaces -}}
{{- toYaml (uniq .Values.networkPolicy.clusterWideNamespaces) -}}
{{- else -}}
{{- toYaml (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{/*
Fails the render with one line when a monitoring object is enabled but the cluster lacks its CRD.
Call with (list $ "podMonitor.enabled" "PodMonitor").
*/}}
{{- define "ddpjob.requireMonitoringCRD" -}}
{{- $root := index . 0 -}}
{{- $value := index . 1 -}}
{{- $kind := index . 2 -}}
{{- if not ($root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind)) -}}
{{- fail (printf "%s=true, but the cluster has no monitoring.coreos.com/v1 %s CRD: install the Prometheus Operator CRDs (e.g. kube-prometheus-stack) first, or set %s=false (with helm template, pass --api-versions monitoring.coreos.com/v1/%s)" $value $kind $value $kind) -}}
{{- end -}}
{{- end -}}

{{/* Labels of the pods a DDPJob creates (set by the operator, see api.py). */}}
{{- define "ddpjob.trainingPodSelector" -}}
matchLabels:
  app.kubernetes.io/managed-by: ddpjob
matchExpressions:
  - key: ddpjob.dev/job-name
    operator: Exists
{{- end -}}

{{/*
The name of a cluster-scoped object of a release: its full name and namespace, so that releases of one name in two
namespaces (namespaced mode, one operator per team) never claim the same ClusterRole.
*/}}
{{- define "ddpjob.clusterScopedName" -}}
{{- printf "%s-%s" (include "ddpjob.fullname" .) .Release.Namespace | trunc 50 | trimSuffix "-" -}}
{{- end -}}
