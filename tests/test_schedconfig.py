"""The kube-scheduler configuration: the right format per Kubernetes version, exact field spellings, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpushare import schedconfig
from gpushare.schedconfig import ConfigError, ConfigFormat, ExtenderOptions, SchedulerOptions

GPUSHARE = Path(sys.executable).parent / "gpushare"

# Field names of kube-scheduler's Extender (k8s.io/kube-scheduler/config/v1 and v1beta3) and of the legacy Policy's
# ExtenderConfig (which spells enableHttps).
V1_EXTENDER_FIELDS = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
                      "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable"}
POLICY_EXTENDER_FIELDS = (V1_EXTENDER_FIELDS - {"enableHTTPS"}) | {"enableHttps"}
TLS_FIELDS = {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData", "caData"}


@pytest.mark.parametrize(("version", "expected"), [
    ("1.11", ConfigFormat.POLICY),
    ("v1.22.17", ConfigFormat.POLICY),
    ("1.23", ConfigFormat.V1BETA3),
    ("v1.24.3", ConfigFormat.V1BETA3),
    ("1.25", ConfigFormat.V1),
    ("v1.30.2-eks-ce1d5eb", ConfigFormat.V1),
    ("1.37.0+k3s1", ConfigFormat.V1),
])
def test_format_follows_the_kubernetes_version(version: str, expected: ConfigFormat) -> None:
    assert schedconfig.format_for(version) is expected


@pytest.mark.parametrize("version", ["", "latest", "1", "one.two", "1.30.x", "1.10", "2.0", "v3.1.4", "0.9"])
def test_bad_versions_are_refused_with_a_sentence(version: str) -> None:
    with pytest.raises(ConfigError, match=r"\.$"):
        schedconfig.format_for(version)


def test_v1_configuration_extends_the_default_scheduler() -> None:
    doc = schedconfig.scheduler_config("1.30", ExtenderOptions(), SchedulerOptions())
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert doc["kind"] == "KubeSchedulerConfiguration"
    assert doc["leaderElection"] == {"leaderElect": True}
    assert "profiles" not in doc
    [ext] = doc["extenders"]
    assert set(ext) <= V1_EXTENDER_FIELDS
    assert ext == {
        "urlPrefix": "http://gpushare-extender.kube-system.svc:39999/gpushare-scheduler",
        "filterVerb": "filter", "prioritizeVerb": "prioritize", "weight": 5, "bindVerb": "bind",
        "preemptVerb": "preempt", "enableHTTPS": False, "httpTimeout": "10s", "nodeCacheCapable": True,
        "managedResources": [{"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False},
                             {"name": "aliyun.com/gpu-count", "ignoredByScheduler": False}],
        "ignorable": False,
    }


def test_second_scheduler_has_its_own_profile_and_lease() -> None:
    sched = SchedulerOptions(scheduler_name="gpushare-scheduler", lease_namespace="gpu-system")
    doc = schedconfig.scheduler_config("1.24", ExtenderOptions(), sched)
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1beta3"
    assert doc["profiles"] == [{"schedulerName": "gpushare-scheduler"}]
    assert doc["leaderElection"] == {"leaderElect": True, "resourceName": "gpushare-scheduler",
                                     "resourceNamespace": "gpu-system"}


def test_https_adds_tls_config() -> None:
    ext = ExtenderOptions(url_prefix=schedconfig.extender_url("svc", "ns", 443, https=True),
                          tls_ca_file="/etc/ca.crt", tls_server_name="svc.ns.svc")
    [entry] = schedconfig.scheduler_config("1.30", ext, SchedulerOptions())["extenders"]
    assert entry["urlPrefix"] == "https://svc.ns.svc:443/gpushare-scheduler"
    assert entry["enableHTTPS"] is True
    assert entry["tlsConfig"] == {"insecure": False, "serverName": "svc.ns.svc", "caFile": "/etc/ca.crt"}
    assert set(entry["tlsConfig"]) <= TLS_FIELDS


def test_client_kubeconfig_for_control_plane_schedulers() -> None:
    doc = schedconfig.scheduler_config("1.29", ExtenderOptions(),
                                       SchedulerOptions(client_kubeconfig="/etc/kubernetes/scheduler.conf"))
    assert doc["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf"}


def test_policy_file_before_1_23_uses_its_own_spellings() -> None:
    ext = ExtenderOptions(url_prefix="https://10.0.0.1:32766/gpushare-scheduler", tls_insecure=True,
                          http_timeout_seconds=7)
    doc = schedconfig.scheduler_config("1.22", ext, SchedulerOptions())
    assert doc["kind"] == "Policy" and doc["apiVersion"] == "v1"
    [entry] = doc["extenders"]
    assert set(entry) <= POLICY_EXTENDER_FIELDS
    assert entry["enableHttps"] is True
    assert entry["httpTimeout"] == 7_000_000_000
    assert entry["tlsConfig"] == {"insecure": True}
    assert entry["nodeCacheCapable"] is True and entry["bindVerb"] == "bind"
    assert entry["preemptVerb"] == "preempt"


@pytest.mark.parametrize("version", ["1.22", "1.24", "1.30"])
def test_every_format_asks_for_preemption_and_keeps_gpu_memory_accounted(version: str) -> None:
    # kube-scheduler's dry run finds victims only for resources it accounts itself.
    [entry] = schedconfig.scheduler_config(version, ExtenderOptions(), SchedulerOptions())["extenders"]
    assert entry["preemptVerb"] == "preempt"
    assert {"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False} in entry["managedResources"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"url_prefix": "gpushare-extender:39999"}, "not an http"),
    ({"weight": 0}, "positive weight"),
    ({"http_timeout_seconds": 0}, "at least 1 second"),
    ({"tls_insecure": True}, "plain http"),
])
def test_invalid_extender_options(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        schedconfig.scheduler_config("1.30", ExtenderOptions(**kwargs), SchedulerOptions())  # type: ignore[arg-type]


def test_policy_cannot_name_a_scheduler() -> None:
    with pytest.raises(ConfigError, match="--scheduler-name=gpushare-scheduler"):
        schedconfig.scheduler_config("1.21", ExtenderOptions(), SchedulerOptions(scheduler_name="gpushare-scheduler"))


def test_dump_round_trips() -> None:
    doc = schedconfig.scheduler_config("1.30", ExtenderOptions(), SchedulerOptions())
    assert yaml.safe_load(schedconfig.dump(doc, "yaml")) == doc
    assert json.loads(schedconfig.dump(doc, "json")) == doc
    with pytest.raises(ConfigError, match="yaml or json"):
        schedconfig.dump(doc, "toml")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GPUSHARE), "scheduler-config", *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_command_prints_yaml_for_current_versions() -> None:
    result = run_cli("--kube-version", "1.30", "--scheduler-name", "gpushare-scheduler", "--namespace", "gpu")
    assert result.returncode == 0, result.stderr
    doc = yaml.safe_load(result.stdout)
    assert doc == schedconfig.scheduler_config(
        "1.30", ExtenderOptions(url_prefix="http://gpushare-extender.gpu.svc:39999/gpushare-scheduler"),
        SchedulerOptions(scheduler_name="gpushare-scheduler", lease_namespace="gpu"))


def test_command_prints_policy_json_for_old_versions() -> None:
    result = run_cli("--kube-version", "v1.20.15", "--https", "--port", "443", "--tls-insecure")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["kind"] == "Policy"
    assert doc["extenders"][0]["urlPrefix"] == "https://gpushare-extender.kube-system.svc:443/gpushare-scheduler"


def test_command_output_flag() -> None:
    result = run_cli("--kube-version", "1.23", "-o", "json", "--url", "http://127.0.0.1:32766/gpushare-scheduler")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["extenders"][0]["urlPrefix"] == "http://127.0.0.1:32766/gpushare-scheduler"


@pytest.mark.parametrize(("args", "message"), [
    (["--kube-version", "banana"], "not a Kubernetes version"),
    (["--kube-version", "1.30", "--https", "--url", "http://x:1/gpushare-scheduler"], "--https contradicts"),
    (["--kube-version", "1.22", "--scheduler-name", "gpushare-scheduler"], "cannot name a scheduler"),
    (["--kube-version", "2.0"], "--kube-version: Kubernetes 2.0 is not a release gpushare knows; give a 1.x version"),
    (["--kube-version", "1.30", "--port", "99999"], "--port 99999 is not a TCP port; give one from 1 to 65535."),
    (["--kube-version", "1.30", "--port", "0"], "--port 0 is not a TCP port"),
    (["--kube-version", "1.30", "--weight", "0"], "--weight 0 is not positive"),
    (["--kube-version", "1.30", "--http-timeout", "-3"], "--http-timeout -3 is not positive; give at least 1 second."),
])
def test_command_errors_are_one_sentence(args: list[str], message: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
