{{- define "zkgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "zkgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "zkgate.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "zkgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "zkgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "zkgate.labels" -}}
{{ include "zkgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "zkgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "zkgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The connect string: the quick-start ZooKeeper, or the given ensemble. */}}
{{- define "zkgate.zookeeperConnect" -}}
{{- if and .Values.zookeeper.auth.existingSecret (not .Values.webhook.enabled) -}}
{{- fail "zookeeper.auth.existingSecret needs webhook.enabled=true: pods get their namespace's ZooKeeper credential from the controller's credential handout, served beside the webhook" -}}
{{- end -}}
{{- if .Values.zookeeper.deploy -}}
{{- /* Qualified with the namespace: the webhook copies it into pods of other namespaces. */ -}}
{{- printf "%s-zookeeper.%s.svc:2181" (include "zkgate.fullname" .) .Release.Namespace -}}
{{- else if .Values.zookeeper.connect -}}
{{- .Values.zookeeper.connect -}}
{{- else -}}
{{- fail "zookeeper.connect is required: the connect string of your ZooKeeper ensemble (host:port[,host:port...][/chroot]), or set zookeeper.deploy=true for a quick-start single node" -}}
{{- end -}}
{{- end -}}

{{/* The rules on the watched resources: a ClusterRole's for all namespaces,
     a Role's with controller.watchNamespace. */}}
{{- define "zkgate.namespacedRules" -}}
- apiGroups: ["zkgate.io"]
  resources: ["barriers", "lockleases"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["zkgate.io"]
  resources: ["barriers/status", "lockleases/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# The Jobs that size Barriers (spec.jobRef).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch"]
# A JobSet's Barrier is sized over its replicated Jobs, read from the JobSet
# (kubernetes-sigs/jobset; nothing is asked when none is installed).
- apiGroups: ["jobset.x-k8s.io"]
  resources: ["jobsets"]
  verbs: ["get"]
# A Job whose pod template is labelled zkgate.io/barrier gets its Barrier
# (made by the leading controller from the Jobs it watches; admission makes
# nothing), replacing an earlier run's (deleted by uid) once that run is over.
- apiGroups: ["zkgate.io"]
  resources: ["barriers"]
  verbs: ["create", "delete"]
# No Secret rule: participants get their namespace's ZooKeeper credential
# and TLS material from the controller's handout (a projected ServiceAccount
# token, checked by TokenReview), never from a Secret the controller writes
# (see the RBAC table in docs/src/security.md).
{{- end -}}

{{/* The webhook's names: its Service's. */}}
{{- define "zkgate.webhookService" -}}
{{- printf "%s-webhook" (include "zkgate.fullname" .) -}}
{{- end -}}

{{- define "zkgate.webhookSecret" -}}
{{- default (printf "%s-webhook-tls" (include "zkgate.fullname" .)) .Values.webhook.secretName -}}
{{- end -}}

{{/*
Which namespaces' objects the webhooks see (given the root context).
*/}}
{{- define "zkgate.webhookNamespaceSelector" -}}
{{- if .Values.controller.watchNamespace -}}
# Only the watched namespace (nothing reconciles elsewhere): a webhook
# that is down holds up no labelled pod of any other namespace. By its
# name label, which the API server puts on every namespace.
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: In
      values: [{{ .Values.controller.watchNamespace | quote }}]
    - key: zkgate.io/webhook
      operator: NotIn
      values: ["disabled"]
{{- else -}}
# kube-system excluded by its name label (which the API server puts on
# every namespace). Any namespace labelled zkgate.io/webhook=disabled is
# left alone too.
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: ["kube-system"]
    - key: zkgate.io/webhook
      operator: NotIn
      values: ["disabled"]
{{- end }}
{{- end }}
