"""The Helm chart, rendered by Helm's own engine through scripts/check_chart.sh (which also runs helm lint and
validates every manifest against the Kubernetes 1.30 schema), then checked for what matters in production."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from alert_rules import alert_rules, series_read, unexported_reads
from test_extender_harness import T4, T4_MIB, gpu_node, spec
from test_extender_tls import extender

from extender.config import DEFAULT_MAX_BINDS, parse_config
from gpushare import schedconfig
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.pki import issue, make_ca
from gpushare.policies import DEFAULT_POLICY
from gpushare.schedconfig import ExtenderOptions, SchedulerOptions

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "gpushare"
HELM_PYTHON = ROOT / ".venv-helm" / "bin" / "python"
EXTENDER_URL = "http://gpushare-extender.kube-system.svc:39999/gpushare-scheduler"

Docs = list[dict[str, Any]]


@pytest.fixture(scope="module")
def rendered(chart_out: Path) -> dict[str, Docs]:
    """Every ci/ values file's manifests, by scenario name."""
    return {d.name: [doc for f in sorted(d.glob("*.yaml")) for doc in yaml.safe_load_all(f.read_text()) if doc]
            for d in chart_out.iterdir()}


def find(docs: Docs, kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    match: dict[str, Any] = matches[0]
    return match


def kinds(docs: Docs) -> set[str]:
    return {d["kind"] for d in docs}


def container(workload: dict[str, Any]) -> dict[str, Any]:
    [only] = workload["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = only
    return found


def scheduler_config(docs: Docs) -> dict[str, Any]:
    cm = find(docs, "ConfigMap", "gpushare-scheduler-config")
    loaded: dict[str, Any] = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    return loaded


def test_every_scenario_renders(rendered: dict[str, Docs]) -> None:
    assert set(rendered) == {"default", "second-scheduler", "ha-tls-monitoring", "self-managed", "policy", "mps"}


def test_extender_runs_restricted(rendered: dict[str, Docs]) -> None:
    deployment = find(rendered["default"], "Deployment", "gpushare-extender")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert "hostNetwork" not in pod
    security = container(deployment)["securityContext"]
    assert security == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "privileged": False,
                        "capabilities": {"drop": ["ALL"]}}


def test_extender_command_and_probes(rendered: dict[str, Docs]) -> None:
    extender = container(find(rendered["default"], "Deployment", "gpushare-extender"))
    assert extender["command"] == ["gpushare-extender"]
    # The chart's default policy is the extender's own default, so a chart install behaves like the README says.
    assert extender["args"] == ["--port=39999", "--health-port=39998", f"--policy={DEFAULT_POLICY}",
                                "--node-choice=filter", "--unit=GiB",
                                "--log-level=INFO", "--bind-timeout=3", f"--max-concurrent-binds={DEFAULT_MAX_BINDS}",
                                "--max-body-bytes=16777216"]
    # The bind budget stays a second below the httpTimeout the chart gives kube-scheduler.
    config = parse_config(extender["args"])
    scheduler = yaml.safe_load(find(rendered["default"], "ConfigMap", "gpushare-scheduler-config")["data"]
                               ["scheduler-config.yaml"])
    assert config.bind_timeout_s + 1 <= int(scheduler["extenders"][0]["httpTimeout"].rstrip("s"))
    # Preemption reaches the extender, and kube-scheduler's dry run sees GPU memory only while it accounts it.
    assert scheduler["extenders"][0]["preemptVerb"] == "preempt"
    assert all(r["ignoredByScheduler"] is False for r in scheduler["extenders"][0]["managedResources"])
    assert extender["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health", "scheme": "HTTP"}
    assert extender["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health", "scheme": "HTTP"}
    service = find(rendered["default"], "Service", "gpushare-extender")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"][0]["port"] == 39999


def test_device_plugin_daemonset(rendered: dict[str, Docs]) -> None:
    daemonset = find(rendered["default"], "DaemonSet", "gpushare-device-plugin")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpushare": "true"}
    assert "hostNetwork" not in pod
    assert pod["hostPID"] is True, "the per-pod overuse check reads host PIDs' cgroups"
    assert {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v} == {
        "device-plugins": "/var/lib/kubelet/device-plugins", "pod-resources": "/var/lib/kubelet/pod-resources"}
    plugin = container(daemonset)
    assert plugin["command"] == ["gpushare-device-plugin"]
    assert "--isolation=none" in plugin["args"] and "--backend=nvml" in plugin["args"]
    assert "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in plugin["args"]
    node_name = next(e for e in plugin["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    security = plugin["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True and security["capabilities"] == {"drop": ["ALL"]}
    assert plugin["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert plugin["readinessProbe"]["httpGet"]["path"] == "/readyz"


def rules(docs: Docs, name: str) -> list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]:
    role = find(docs, "ClusterRole", name)
    return [(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]]


def test_rbac_is_least_privilege(rendered: dict[str, Docs]) -> None:
    docs = rendered["default"]
    assert rules(docs, "gpushare-extender") == [
        (("",), ("nodes",), ("list", "watch")),
        (("",), ("pods",), ("get", "list", "watch")),
        (("",), ("bindings",), ("create",)),
        (("",), ("events",), ("create",)),
        (("policy",), ("poddisruptionbudgets",), ("list", "watch")),
        (("scheduling.x-k8s.io",), ("podgroups",), ("get",)),
    ]
    assert rules(docs, "gpushare-device-plugin") == [
        (("",), ("pods",), ("get", "list", "watch", "patch")),
        (("",), ("nodes", "nodes/status"), ("patch",)),
    ]
    for scenario in rendered.values():
        for doc in scenario:
            for rule in doc.get("rules", []):
                assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], doc["metadata"]["name"]
    assert "Role" not in kinds(docs), "a single extender needs no lease"


def test_default_scheduler_config_matches_the_command(rendered: dict[str, Docs]) -> None:
    expected = schedconfig.kube_scheduler_configuration(ExtenderOptions(url_prefix=EXTENDER_URL), SchedulerOptions())
    assert scheduler_config(rendered["default"]) == expected
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule", "PodDisruptionBudget"} & kinds(rendered["default"])
    assert find(rendered["default"], "Deployment")["metadata"]["name"] == "gpushare-extender"
    assert "--leader-elect" not in container(find(rendered["default"], "Deployment"))["args"]


def test_second_scheduler(rendered: dict[str, Docs]) -> None:
    docs = rendered["second-scheduler"]
    scheduler = find(docs, "Deployment", "gpushare-scheduler")
    kube_scheduler = container(scheduler)
    # No tag given: the cluster's own version (Helm's default when rendering offline), so the skew is zero.
    assert kube_scheduler["image"].startswith("registry.k8s.io/kube-scheduler:v1.")
    assert scheduler["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert "--config=/etc/kubernetes/gpushare/scheduler-config.yaml" in kube_scheduler["command"]
    assert kube_scheduler["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = scheduler["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": "gpushare-scheduler-config"}} in volumes
    [entry] = scheduler_config(docs)["extenders"]
    assert entry["urlPrefix"] == EXTENDER_URL.replace("http://", "https://")
    assert entry["tlsConfig"] == {"insecure": False, "caFile": "/etc/gpushare/scheduler-tls/ca.crt",
                                  "certFile": "/etc/gpushare/scheduler-tls/tls.crt",
                                  "keyFile": "/etc/gpushare/scheduler-tls/tls.key"}
    client_tls = next(v for v in scheduler["spec"]["template"]["spec"]["volumes"] if v["name"] == "scheduler-tls")
    assert client_tls["secret"]["secretName"] == "gpushare-scheduler-client-tls"
    policy = find(docs, "NetworkPolicy")["spec"]
    assert [f["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for f in policy["ingress"][0]["from"]] == [
        "second-scheduler", "extender"]
    # Names outside the release namespace carry the release's, so two releases' schedulers never collide.
    cluster_scoped = {d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"
                      and d["subjects"][0]["name"] == "gpushare-scheduler"}
    assert cluster_scoped == {"gpushare-gpushare-scheduler-as-kube-scheduler",
                              "gpushare-gpushare-scheduler-as-volume-scheduler"}
    bound = {(d["kind"], d["roleRef"]["name"], d["metadata"].get("namespace")) for d in docs
             if d["kind"] in ("ClusterRoleBinding", "RoleBinding") and d["subjects"][0]["name"] == "gpushare-scheduler"}
    assert bound == {("ClusterRoleBinding", "system:kube-scheduler", None),
                     ("ClusterRoleBinding", "system:volume-scheduler", None),
                     ("RoleBinding", "extension-apiserver-authentication-reader", "kube-system"),
                     ("RoleBinding", "gpushare-scheduler-leader-election", "kube-system")}
    lease_role = find(docs, "Role", "gpushare-scheduler-leader-election")
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["gpushare-scheduler"],
            "verbs": ["get", "update"]} in lease_role["rules"]


def test_ha_tls_and_monitoring(rendered: dict[str, Docs], chart_out: Path) -> None:
    docs = rendered["ha-tls-monitoring"]
    deployment = find(docs, "Deployment", "gpushare-extender")
    assert deployment["spec"]["replicas"] == 3
    assert "podAntiAffinity" in deployment["spec"]["template"]["spec"]["affinity"]
    extender = container(deployment)
    assert "--tls-cert=/etc/gpushare/tls/tls.crt" in extender["args"]
    assert {"--leader-elect", "--lease-name=gpushare-extender", "--peer-ca=/etc/gpushare/tls/ca.crt"} <= set(
        extender["args"])
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in extender["env"]} == {
        "POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_IP": "status.podIP"}
    # Probes present no client certificate: they use the plain health port, which serves nothing else.
    assert extender["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health", "scheme": "HTTP"}
    assert find(docs, "PodDisruptionBudget", "gpushare-extender")["spec"]["minAvailable"] == 1
    lease = find(docs, "Role", "gpushare-extender-leader-election")
    assert lease["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
                              {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                               "resourceNames": ["gpushare-extender"], "verbs": ["get", "update"]}]
    assert "--tls-client-ca=/etc/gpushare/tls/client-ca.crt" in extender["args"]
    assert "--tls-client-names=kube-scheduler,system:gpushare-scheduler" in extender["args"]
    assert find(docs, "PodDisruptionBudget", "gpushare-scheduler")["spec"]["minAvailable"] == 1
    assert "podAntiAffinity" in find(docs, "Deployment", "gpushare-scheduler")["spec"]["template"]["spec"]["affinity"]
    [entry] = scheduler_config(docs)["extenders"]
    assert entry["urlPrefix"] == "https://gpushare-extender.kube-system.svc:39999/gpushare-scheduler"
    assert entry["enableHTTPS"] is True
    assert entry["tlsConfig"] == {"insecure": False, "caFile": "/etc/gpushare/scheduler-tls/ca.crt"}
    monitor = find(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["port"] == "health" and "tlsConfig" not in monitor["spec"]["endpoints"][0]
    assert find(docs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    rule = find(docs, "PrometheusRule", "gpushare")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    alerts = {r["alert"]: r for r in alert_rules(chart_out, "gpushare-extender")}
    assert set(alerts) == {"GpushareExtenderNoLeader", "GpushareExtenderBindsFailing",
                           "GpushareExtenderTLSHandshakesRefused", "GpushareExtenderCertificateExpiresSoon"}
    assert alerts["GpushareExtenderNoLeader"]["labels"]["severity"] == "critical"
    assert "< 21 * 86400" in alerts["GpushareExtenderCertificateExpiresSoon"]["expr"]  # certificateWarningDays
    for alert in alerts.values():  # only this release's extender, where several are scraped
        assert all(selector.startswith('namespace="kube-system"') for _, selector in series_read(alert["expr"]))
    device = {r["alert"] for r in alert_rules(chart_out, "gpushare-device-plugin")}
    assert device == {"GpushareGPUUnhealthy", "GpushareAllocateFailing"}


def test_every_series_and_label_the_extenders_alerts_read_is_on_its_metrics(chart_out: Path, tmp_path: Path
                                                                            ) -> None:
    """The extender serves mutual TLS here, as in the monitoring scenario, so every series the rules read is
    there; the device plugin's alerts are checked against its own /metrics in test_kubelet.py."""
    ca = make_ca(tmp_path, "ca")
    server = issue(ca, tmp_path, "extender", 1, server=True)
    with LocalCluster(spec(gpu_node("n1", (T4, T4_MIB)))) as cluster, \
            extender(cluster, tmp_path, "--port", "0", "--health-port", "0", "--tls-cert", server.cert, "--tls-key",
                     server.key, "--tls-client-ca", ca.cert) as ext:
        text = httpx.get(ext.health_url + "/metrics").text
    assert unexported_reads(alert_rules(chart_out, "gpushare-extender"), text) == []


def test_monitoring_objects_only_where_the_prometheus_operator_api_exists(chart_out: Path, tmp_path: Path) -> None:
    """Without monitoring.coreos.com/v1 the API server would refuse the whole install for an unknown kind: the
    chart leaves the ServiceMonitor and PodMonitor out and NOTES.txt says so. check_chart.sh renders with the API."""
    warning = "WARNING: monitoring.serviceMonitor.enabled=true, but this cluster has no monitoring.coreos.com/v1 API"
    assert warning not in (chart_out / "ha-tls-monitoring" / "NOTES.txt").read_text()
    result = subprocess.run([str(HELM_PYTHON), str(ROOT / "scripts" / "render_chart.py"), str(CHART), str(tmp_path),
                             str(CHART / "ci" / "ha-tls-monitoring-values.yaml")], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "ha-tls-monitoring"
    docs = [doc for f in sorted(out.glob("*.yaml")) for doc in yaml.safe_load_all(f.read_text()) if doc]
    assert "Deployment" in kinds(docs)
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule"} & kinds(docs)
    assert warning in (out / "NOTES.txt").read_text()
    assert "monitoring.prometheusRule.enabled=true, but this cluster has no monitoring.coreos.com/v1 API" in (
        out / "NOTES.txt").read_text()


@pytest.mark.parametrize("scenario", ["default", "self-managed"])
def test_notes_tell_how_to_check_the_extender_on_its_health_port(chart_out: Path, scenario: str) -> None:
    notes = (chart_out / scenario / "NOTES.txt").read_text()
    assert "health port, 39998 (extender.healthPort)" in notes
    assert "serves only /healthz, /readyz and /metrics" in notes
    assert "curl -s http://127.0.0.1:39998/readyz" in notes
    # The Service for a cluster-network extender; the node itself for the host-network one of path B.
    port_forward = "kubectl -n kube-system port-forward service/gpushare-extender 39998:39998"
    assert (port_forward in notes) == (scenario == "default")


def test_kubeadm_control_plane_reaches_its_extender_on_the_host_network(rendered: dict[str, Docs]) -> None:
    docs = rendered["self-managed"]
    extender = find(docs, "DaemonSet", "gpushare-extender")
    pod = extender["spec"]["template"]["spec"]
    # Beside each static kube-scheduler, on its network: 127.0.0.1 needs neither cluster DNS nor kube-proxy.
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"]
    args = container(extender)["args"]
    assert {"--port=39999", "--leader-elect", "--tls-cert=/etc/gpushare/tls/tls.crt",
            "--tls-client-ca=/etc/gpushare/tls/client-ca.crt", "--unit=MiB", "--policy=spread"} <= set(args)
    assert "NetworkPolicy" not in kinds(docs), "host-network pods are outside NetworkPolicy; mutual TLS guards them"
    config = scheduler_config(docs)
    assert config["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf"}
    [entry] = config["extenders"]
    assert entry["urlPrefix"] == "https://127.0.0.1:39999/gpushare-scheduler"
    assert entry["tlsConfig"] == {"insecure": False, "caFile": "/etc/kubernetes/gpushare/ca.crt",
                                  "certFile": "/etc/kubernetes/gpushare/tls.crt",
                                  "keyFile": "/etc/kubernetes/gpushare/tls.key"}
    assert entry["weight"] == 10


def test_hami_core_is_installed_on_the_hosts_the_plugin_names(rendered: dict[str, Docs]) -> None:
    plugin = find(rendered["self-managed"], "DaemonSet", "gpushare-device-plugin")
    pod = plugin["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpushare": "true", "nvidia.com/gpu.present": "true"}
    assert pod["runtimeClassName"] == "nvidia"
    [init] = pod["initContainers"]
    assert init["image"] == "docker.io/projecthami/hami:v2.6.0"
    script = init["args"][0]
    assert "/k8s-vgpu/lib/nvidia/libvgpu.so*" in script and "mv -f /host-vgpu/libvgpu.so.tmp" in script
    assert "echo /usr/local/vgpu/libvgpu.so > /host-vgpu/ld.so.preload.tmp" in script
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host == {"device-plugins": "/var/lib/k0s/kubelet/device-plugins",
                    "pod-resources": "/var/lib/k0s/kubelet/pod-resources", "hami-core": "/usr/local/vgpu"}
    assert {"--hami-library=/usr/local/vgpu/libvgpu.so", "--hami-preload=/usr/local/vgpu/ld.so.preload",
            "--isolation=hami-core"} <= set(container(plugin)["args"])


def test_mps_daemon_and_its_mounts(rendered: dict[str, Docs]) -> None:
    docs = rendered["mps"]
    plugin = container(find(docs, "DaemonSet", "gpushare-device-plugin"))
    assert plugin["image"] == ("ghcr.io/gpushare/gpushare@sha256:"
                               "0000000000000000000000000000000000000000000000000000000000000001")
    assert "--mps-pipe-dir=/tmp/nvidia-mps" in plugin["args"]
    daemon = find(docs, "DaemonSet", "gpushare-mps-control")
    pod = daemon["spec"]["template"]["spec"]
    assert pod["hostIPC"] is True
    assert container(daemon)["command"] == ["nvidia-cuda-mps-control", "-f"]
    assert {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]} == {
        "mps-pipe": "/tmp/nvidia-mps", "mps-log": "/var/log/nvidia-mps", "shm": "/dev/shm"}


def test_policy_file_for_old_control_planes(rendered: dict[str, Docs]) -> None:
    docs = rendered["policy"]
    cm = find(docs, "ConfigMap", "gpushare-scheduler-config")
    assert list(cm["data"]) == ["scheduler-policy.json"]
    assert yaml.safe_load(cm["data"]["scheduler-policy.json"]) == schedconfig.policy(
        ExtenderOptions(url_prefix=EXTENDER_URL))
    assert "DaemonSet" not in kinds(docs)


@pytest.fixture()
def render_values(tmp_path: Path, rendered: dict[str, Docs]) -> Iterator[Any]:
    """Render one values document through the same script; (exit code, FAILED message or None)."""

    def render(values: dict[str, Any]) -> tuple[int, str | None]:
        values_file = tmp_path / "case-values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        result = subprocess.run([str(HELM_PYTHON), str(ROOT / "scripts" / "render_chart.py"), str(CHART),
                                 str(tmp_path / "out"), str(values_file)], capture_output=True, text=True,
                                timeout=120, check=False)
        failed = tmp_path / "out" / "case" / "FAILED"
        return result.returncode, failed.read_text() if failed.exists() else None

    yield render


@pytest.mark.parametrize(("values", "message"), [
    ({"memoryUnit": "TiB"}, "at '/memoryUnit': value must be one of 'GiB', 'MiB'"),
    ({"devicePlugin": {"isolation": "mig"}}, "at '/devicePlugin/isolation'"),
    ({"extender": {"tls": {"enabled": True}}}, "extender.tls.enabled needs extender.tls.secretName"),
    ({}, "The extender would accept filter, prioritize and bind from anyone who reaches it"),
    ({"extender": {"replica": 3, "insecure": {"acknowledged": True}}},
     "additional properties 'replica' not allowed"),
    ({"devicePlugin": {"tolerations": {}}, "extender": {"insecure": {"acknowledged": True}}},
     "at '/devicePlugin/tolerations'"),
    ({"secondScheduler": {"enabled": True, "image": {"tag": "v1.22.17"}},
      "extender": {"insecure": {"acknowledged": True}}},
     "secondScheduler.image.tag must be v1.23 or newer"),
    ({"extender": {"bindTimeoutSeconds": 9.5}}, "must be at least 1 s below schedulerConfig.httpTimeoutSeconds"),
    ({"extender": {"maxConcurrentBinds": 0}}, "at '/extender/maxConcurrentBinds'"),
    ({"extender": {"tls": {"enabled": True, "secretName": "s", "clientCAKey": "", "clientNames": ["kube-scheduler"]},
                   "insecure": {"acknowledged": True}}},
     "extender.tls.clientNames narrows the client certificates that the client CA accepts"),
    ({"extender": {"tls": {"enabled": True, "secretName": "s", "clientNames": ["a,b"]}}},
     "at '/extender/tls/clientNames/0'"),
    ({"monitoring": {"prometheusRule": {"enabled": True, "certificateWarningDays": 0}}},
     "at '/monitoring/prometheusRule/certificateWarningDays'"),
    ({"monitoring": {"prometheusRule": {"enabled": True, "interval": "30s"}}},
     "additional properties 'interval' not allowed"),
])
def test_bad_values_fail_with_a_reason(render_values: Any, values: dict[str, Any], message: str) -> None:
    code, failure = render_values(values)
    assert code == 1
    assert failure is not None and message in failure
