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

{{/* repository:tag, or repository@digest when a digest is given: dict "image" <values> "tag" <default tag>. */}}
{{- define "gpushare.imageRef" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .tag .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "gpushare.image" -}}
{{- include "gpushare.imageRef" (dict "image" .Values.image "tag" .Chart.AppVersion) -}}
{{- end -}}

{{/* The second scheduler's version: its image tag, else the cluster's own (v1.30.4, without a vendor suffix). */}}
{{- define "gpushare.secondSchedulerTag" -}}
{{- default (regexReplaceAll "[-+].*$" .Capabilities.KubeVersion.Version "") .Values.secondScheduler.image.tag -}}
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
{{- else if .Values.extender.controlPlane.enabled -}}
{{- printf "%s://127.0.0.1:%d/gpushare-scheduler" (ternary "https" "http" .Values.extender.tls.enabled) (int .Values.extender.port) -}}
{{- else -}}
{{- printf "%s://%s.%s.svc:%d/gpushare-scheduler" (ternary "https" "http" .Values.extender.tls.enabled) (include "gpushare.extenderName" .) .Release.Namespace (int .Values.extender.service.port) -}}
{{- end -}}
{{- end -}}

{{/* The Kubernetes version the scheduler configuration is written for: the second scheduler's image, else
     schedulerConfig.kubeVersion, else the cluster's. */}}
{{- define "gpushare.schedulerVersion" -}}
{{- if .Values.secondScheduler.enabled -}}
{{- include "gpushare.secondSchedulerTag" . -}}
{{- else if .Values.schedulerConfig.kubeVersion -}}
{{- .Values.schedulerConfig.kubeVersion -}}
{{- else -}}
{{- .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{- end -}}

{{- define "gpushare.usesPolicyFile" -}}
{{- if semverCompare "<1.23-0" (include "gpushare.schedulerVersion" .) -}}true{{- end -}}
{{- end -}}

{{/* Where kube-scheduler finds its client certificate and the extender's CA: the mounted Secret for the
     second scheduler, schedulerConfig.tls.certDir on a control-plane node. */}}
{{- define "gpushare.schedulerCertDir" -}}
{{- ternary "/etc/gpushare/scheduler-tls" .Values.schedulerConfig.tls.certDir .Values.secondScheduler.enabled -}}
{{- end -}}

{{- define "gpushare.extenderTLSConfig" -}}
{{- $dir := include "gpushare.schedulerCertDir" . -}}
{{- $tls := dict "insecure" false "caFile" (printf "%s/ca.crt" $dir) -}}
{{- if .Values.schedulerConfig.tls.clientSecretName -}}
{{- $_ := set $tls "certFile" (printf "%s/tls.crt" $dir) -}}
{{- $_ := set $tls "keyFile" (printf "%s/tls.key" $dir) -}}
{{- end -}}
{{- toJson $tls -}}
{{- end -}}

{{/* Mutual TLS is on when the extender verifies client certificates. */}}
{{- define "gpushare.mutualTLS" -}}
{{- if and .Values.extender.tls.enabled .Values.extender.tls.clientCAKey -}}true{{- end -}}
{{- end -}}

{{- define "gpushare.clientKubeconfig" -}}
{{- if .Values.schedulerConfig.clientKubeconfig -}}
{{- .Values.schedulerConfig.clientKubeconfig -}}
{{- else if and .Values.extender.controlPlane.enabled (not .Values.secondScheduler.enabled) -}}
/etc/kubernetes/scheduler.conf
{{- end -}}
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
{{- $extender := dict "urlPrefix" $url "filterVerb" "filter" "prioritizeVerb" "prioritize" "weight" (int .Values.schedulerConfig.weight) "bindVerb" "bind" "preemptVerb" "preempt" "enableHTTPS" $https "httpTimeout" (printf "%ds" (int .Values.schedulerConfig.httpTimeoutSeconds)) "nodeCacheCapable" true "managedResources" (include "gpushare.managedResources" . | fromJsonArray) "ignorable" false -}}
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
{{- with include "gpushare.clientKubeconfig" . -}}
{{- $_ := set $config "clientConnection" (dict "kubeconfig" .) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The Policy file of kube-scheduler before 1.23: enableHttps spelling, httpTimeout in nanoseconds. */}}
{{- define "gpushare.schedulerPolicy" -}}
{{- $url := include "gpushare.extenderURL" . -}}
{{- $https := hasPrefix "https://" $url -}}
{{- $extender := dict "urlPrefix" $url "filterVerb" "filter" "prioritizeVerb" "prioritize" "weight" (int .Values.schedulerConfig.weight) "bindVerb" "bind" "preemptVerb" "preempt" "enableHttps" $https "httpTimeout" (mul (int .Values.schedulerConfig.httpTimeoutSeconds) 1000000000) "nodeCacheCapable" true "managedResources" (include "gpushare.managedResources" . | fromJsonArray) "ignorable" false -}}
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
