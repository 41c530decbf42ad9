{{/* Names: the release-based prefix, short enough for every suffix this chart adds. */}}
{{- define "gpushare.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpushare.selectorLabels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpushare.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{ include "gpushare.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gpushare.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "gpushare.extenderName" -}}
{{- printf "%s-extender" (include "gpushare.fullname" .) -}}
{{- end -}}

{{- define "gpushare.devicePluginName" -}}
{{- printf "%s-device-plugin" (include "gpushare.fullname" .) -}}
{{- end -}}

{{- define "gpushare.extenderURL" -}}
{{- if .Values.schedulerConfig.urlPrefix -}}
{{- .Values.schedulerConfig.urlPrefix -}}
{{- else -}}
{{- printf "%s://%s.%s.svc:%d/gpushare-scheduler" (ternary "https" "http" .Values.extender.tls.enabled) (include "gpushare.extenderName" .) .Release.Namespace (int .Values.extender.service.port) -}}
{{- end -}}
{{- end -}}

{{/* The Kubernetes version the scheduler configuration is written for: the second scheduler's image, else
     schedulerConfig.kubeVersion, else the cluster's. */}}
{{- define "gpushare.schedulerVersion" -}}
{{- if .Values.secondScheduler.enabled -}}
{{- .Values.secondScheduler.image.tag -}}
{{- else if .Values.schedulerConfig.kubeVersion -}}
{{- .Values.schedulerConfig.kubeVersion -}}
{{- else -}}
{{- .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{- end -}}

{{- define "gpushare.usesPolicyFile" -}}
{{- if semverCompare "<1.23-0" (include "gpushare.schedulerVersion" .) -}}true{{- end -}}
{{- end -}}

{{- define "gpushare.extenderTLSConfig" -}}
{{- $tls := dict "insecure" .Values.schedulerConfig.tls.insecure -}}
{{- $caFile := .Values.schedulerConfig.tls.caFile -}}
{{- if and (not $caFile) .Values.secondScheduler.enabled .Values.extender.tls.enabled -}}
{{- $caFile = "/etc/gpushare/tls/ca.crt" -}}
{{- end -}}
{{- if $caFile -}}
{{- $_ := set $tls "caFile" $caFile -}}
{{- end -}}
{{- toJson $tls -}}
{{- end -}}

{{- define "gpushare.managedResources" -}}
{{- toJson (list (dict "name" "aliyun.com/gpu-mem" "ignoredByScheduler" false) (dict "name" "aliyun.com/gpu-count" "ignoredByScheduler" false)) -}}
{{- end -}}

{{/* KubeSchedulerConfiguration (v1 from 1.25, v1beta3 for 1.23 and 1.24): the same document that
     `gpushare scheduler-config` prints. */}}
{{- define "gpushare.schedulerConfiguration" -}}
{{- $version := include "gpushare.schedulerVersion" . -}}
{{- $url := include "gpushare.extenderURL" . -}}
{{- $https := hasPrefix "https://" $url -}}
{{- $extender := dict "urlPrefix" $url "filterVerb" "filter" "prioritizeVerb" "prioritize" "weight" (int .Values.schedulerConfig.weight) "bindVerb" "bind" "enableHTTPS" $https "httpTimeout" (printf "%ds" (int .Values.schedulerConfig.httpTimeoutSeconds)) "nodeCacheCapable" true "managedResources" (include "gpushare.managedResources" . | fromJsonArray) "ignorable" false -}}
{{- if $https -}}
{{- $_ := set $extender "tlsConfig" (include "gpushare.extenderTLSConfig" . | fromJson) -}}
{{- end -}}
{{- $leader := dict "leaderElect" true -}}
{{- $config := dict "apiVersion" (ternary "kubescheduler.config.k8s.io/v1" "kubescheduler.config.k8s.io/v1beta3" (semverCompare ">=1.25-0" $version)) "kind" "KubeSchedulerConfiguration" "leaderElection" $leader "extenders" (list $extender) -}}
{{- if .Values.secondScheduler.enabled -}}
{{- $_ := set $leader "resourceName" .Values.secondScheduler.name -}}
{{- $_ := set $leader "resourceNamespace" .Release.Namespace -}}
{{- $_ := set $config "profiles" (list (dict "schedulerName" .Values.secondScheduler.name)) -}}
{{- end -}}
{{- with .Values.schedulerConfig.clientKubeconfig -}}
{{- $_ := set $config "clientConnection" (dict "kubeconfig" .) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The Policy file of kube-scheduler before 1.23: enableHttps spelling, httpTimeout in nanoseconds. */}}
{{- define "gpushare.schedulerPolicy" -}}
{{- $url := include "gpushare.extenderURL" . -}}
{{- $https := hasPrefix "https://" $url -}}
{{- $extender := dict "urlPrefix" $url "filterVerb" "filter" "prioritizeVerb" "prioritize" "weight" (int .Values.schedulerConfig.weight) "bindVerb" "bind" "enableHttps" $https "httpTimeout" (mul (int .Values.schedulerConfig.httpTimeoutSeconds) 1000000000) "nodeCacheCapable" true "managedResources" (include "gpushare.managedResources" . | fromJsonArray) "ignorable" false -}}
{{- if $https -}}
{{- $_ := set $extender "tlsConfig" (include "gpushare.extenderTLSConfig" . | fromJson) -}}
{{- end -}}
{{- toPrettyJson (dict "kind" "Policy" "apiVersion" "v1" "extenders" (list $extender)) -}}
{{- end -}}

{{- define "gpushare.restrictedContainerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
{{- end -}}
