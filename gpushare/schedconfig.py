"""kube-scheduler configuration that plugs the gpushare extender in, for every Kubernetes version we support.

Pure generation: the ``gpushare scheduler-config`` command and the tests print and read these documents; the
Helm chart renders the same shape from its templates.

Which format a kube-scheduler reads depends on its version:

* before 1.23: the legacy ``Policy`` file (``--policy-config-file``), JSON, keys ``enableHttps`` and an
  ``httpTimeout`` in nanoseconds (a Go ``time.Duration``). Kubernetes 1.23 removed it.
* 1.23 and 1.24: ``KubeSchedulerConfiguration`` ``kubescheduler.config.k8s.io/v1beta3`` (added in 1.23,
  removed in 1.29).
* 1.25 and later: ``kubescheduler.config.k8s.io/v1`` (GA in 1.25).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import yaml

from gpushare.contract import MANAGED_RESOURCES

URL_PATH = "/gpushare-scheduler"
DEFAULT_SERVICE = "gpushare-extender"
DEFAULT_NAMESPACE = "kube-system"
DEFAULT_PORT = 39999
# How much the extender's scores count against kube-scheduler's own plugins (the chart's schedulerConfig.weight).
DEFAULT_WEIGHT = 5
SECOND_SCHEDULER_NAME = "gpushare-scheduler"

API_V1 = "kubescheduler.config.k8s.io/v1"
API_V1BETA3 = "kubescheduler.config.k8s.io/v1beta3"


class ConfigFormat(StrEnum):
    POLICY = "Policy"
    V1BETA3 = API_V1BETA3
    V1 = API_V1


class ConfigError(ValueError):
    """Options that no kube-scheduler would accept; the text tells the operator what to change."""


def extender_url(service: str = DEFAULT_SERVICE, namespace: str = DEFAULT_NAMESPACE, port: int = DEFAULT_PORT,
                 https: bool = False) -> str:
    """The in-cluster address of the extender's Service."""
    scheme = "https" if https else "http"
    return f"{scheme}://{service}.{namespace}.svc:{port}{URL_PATH}"


@dataclass(frozen=True)
class ExtenderOptions:
    """How kube-scheduler reaches the extender. HTTPS is on exactly when the URL says ``https://``."""

    url_prefix: str = extender_url()
    weight: int = DEFAULT_WEIGHT
    http_timeout_seconds: int = 10
    tls_ca_file: str | None = None
    tls_server_name: str | None = None
    tls_insecure: bool = False

    @property
    def https(self) -> bool:
        return self.url_prefix.startswith("https://")

    def validate(self) -> None:
        if not re.match(r"^https?://[^/\s]+", self.url_prefix):
            raise ConfigError(f"The extender URL {self.url_prefix!r} is not an http:// or https:// address; "
                              f"use e.g. {extender_url()}.")
        if self.weight < 1:
            raise ConfigError(f"The extender weight is {self.weight}; kube-scheduler needs a positive weight.")
        if self.http_timeout_seconds < 1:
            raise ConfigError(f"The HTTP timeout is {self.http_timeout_seconds}s; use at least 1 second.")
        tls_set = self.tls_ca_file or self.tls_server_name or self.tls_insecure
        if tls_set and not self.https:
            raise ConfigError("TLS options were given for a plain http:// extender URL; use an https:// URL.")


@dataclass(frozen=True)
class SchedulerOptions:
    """The kube-scheduler around the extender.

    ``scheduler_name`` set means a second scheduler that pods opt into with ``schedulerName``; it then takes its
    own leader-election lease so it never competes with the default scheduler's.
    """

    scheduler_name: str | None = None
    leader_elect: bool = True
    lease_namespace: str = DEFAULT_NAMESPACE
    client_kubeconfig: str | None = None


def parse_kube_version(text: str) -> tuple[int, int]:
    """``1.30``, ``v1.30.2`` or ``v1.30.2-eks-abc`` -> (1, 30)."""
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$", text.strip())
    if not match:
        raise ConfigError(f"{text!r} is not a Kubernetes version; write it like 1.30 or v1.30.2.")
    major, minor = int(match.group(1)), int(match.group(2))
    if (major, minor) < (1, 11):
        raise ConfigError(f"Kubernetes {major}.{minor} is older than the oldest version gpushare supports (1.11).")
    if major != 1:
        # Only 1.x releases exist; a 2.0 could change the configuration formats, so guessing one would be wrong.
        raise ConfigError(f"Kubernetes {major}.{minor} is not a release gpushare knows; give a 1.x version from "
                          f"1.11 on, like 1.30.")
    return major, minor


def format_for(kube_version: str) -> ConfigFormat:
    version = parse_kube_version(kube_version)
    if version < (1, 23):
        return ConfigFormat.POLICY
    if version < (1, 25):
        return ConfigFormat.V1BETA3
    return ConfigFormat.V1


def _managed_resources() -> list[dict[str, Any]]:
    return [{"name": name, "ignoredByScheduler": False} for name in MANAGED_RESOURCES]


def _tls_config(ext: ExtenderOptions) -> dict[str, Any]:
    tls: dict[str, Any] = {"insecure": ext.tls_insecure}
    if ext.tls_server_name:
        tls["serverName"] = ext.tls_server_name
    if ext.tls_ca_file:
        tls["caFile"] = ext.tls_ca_file
    return tls


def _entry(ext: ExtenderOptions, https_key: str, timeout: str | int) -> dict[str, Any]:
    """An extender entry; the Policy file and KubeSchedulerConfiguration spell HTTPS and the timeout apart."""
    ext.validate()
    entry: dict[str, Any] = {
        "urlPrefix": ext.url_prefix,
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": ext.weight,
        "bindVerb": "bind",
        # After a FitError, kube-scheduler's dry run proposes victims per node; the extender answers which of
        # them free the right GPUs. The dry run finds any only because the GPU resources stay accounted by
        # kube-scheduler (ignoredByScheduler: false below).
        "preemptVerb": "preempt",
        https_key: ext.https,
        "httpTimeout": timeout,
        "nodeCacheCapable": True,
        "managedResources": _managed_resources(),
        "ignorable": False,
    }
    if ext.https:
        entry["tlsConfig"] = _tls_config(ext)
    return entry


def extender_entry(ext: ExtenderOptions) -> dict[str, Any]:
    """One entry of ``KubeSchedulerConfiguration.extenders`` (v1beta3 and v1 share the shape)."""
    return _entry(ext, "enableHTTPS", f"{ext.http_timeout_seconds}s")


def kube_scheduler_configuration(ext: ExtenderOptions, sched: SchedulerOptions,
                                 api_version: str = API_V1) -> dict[str, Any]:
    """A complete ``KubeSchedulerConfiguration`` with the extender and, for a second scheduler, its profile."""
    if api_version not in (API_V1, API_V1BETA3):
        raise ConfigError(f"{api_version!r} is not a KubeSchedulerConfiguration version gpushare writes; "
                          f"use {API_V1} or {API_V1BETA3}.")
    leader: dict[str, Any] = {"leaderElect": sched.leader_elect}
    if sched.leader_elect and sched.scheduler_name:
        leader["resourceName"] = sched.scheduler_name
        leader["resourceNamespace"] = sched.lease_namespace
    doc: dict[str, Any] = {"apiVersion": api_version, "kind": "KubeSchedulerConfiguration",
                           "leaderElection": leader}
    if sched.client_kubeconfig:
        doc["clientConnection"] = {"kubeconfig": sched.client_kubeconfig}
    if sched.scheduler_name:
        doc["profiles"] = [{"schedulerName": sched.scheduler_name}]
    doc["extenders"] = [extender_entry(ext)]
    return doc


def policy(ext: ExtenderOptions) -> dict[str, Any]:
    """The legacy Policy file for kube-scheduler before 1.23 (``--policy-config-file``); its timeout is in ns."""
    entry = _entry(ext, "enableHttps", ext.http_timeout_seconds * 1_000_000_000)
    return {"kind": "Policy", "apiVersion": "v1", "extenders": [entry]}


def scheduler_config(kube_version: str, ext: ExtenderOptions, sched: SchedulerOptions) -> dict[str, Any]:
    """The document the kube-scheduler of ``kube_version`` reads."""
    fmt = format_for(kube_version)
    if fmt is ConfigFormat.POLICY:
        if sched.scheduler_name:
            raise ConfigError(
                f"Kubernetes {kube_version} reads a Policy file, which cannot name a scheduler; start the second "
                f"kube-scheduler with --scheduler-name={sched.scheduler_name} and this policy instead.")
        if sched.client_kubeconfig:
            raise ConfigError(f"Kubernetes {kube_version} reads a Policy file, which has no client connection; "
                              "pass --kubeconfig to kube-scheduler itself.")
        return policy(ext)
    return kube_scheduler_configuration(ext, sched, str(fmt))


def dump(doc: dict[str, Any], output: str) -> str:
    """Serialise as ``yaml`` or ``json``."""
    if output == "json":
        return json.dumps(doc, indent=2) + "\n"
    if output == "yaml":
        return str(yaml.safe_dump(doc, sort_keys=False))
    raise ConfigError(f"Unknown output format {output!r}; use yaml or json.")
