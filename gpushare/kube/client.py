"""Find the cluster the way kubectl does, for the extender, the device plugin and ``kubectl inspect gpushare``.

Precedence (client-go's): an explicit ``--kubeconfig`` file; else the files named in ``$KUBECONFIG`` (a
``os.pathsep``-separated list, merged, missing files skipped; when it is set, ``~/.kube/config`` is not read);
else ``~/.kube/config`` if it exists; else the pod's service account when ``$KUBERNETES_SERVICE_HOST`` is set.
``--context`` picks a context of the kubeconfig files. Anything else is a ``KubeConfigError`` naming what was
tried and what to pass.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.config import incluster_config, kube_config
from kubernetes.config.config_exception import ConfigException

from gpushare.kube.api import Kube

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeConfigError(Exception):
    """No usable cluster configuration; the text says what was tried and what to pass."""


def _first_current_context(paths: list[Path]) -> str | None:
    for path in paths:
        loaded = yaml.safe_load(path.read_text())
        if isinstance(loaded, dict) and loaded.get("current-context"):
            return str(loaded["current-context"])
    return None


def _from_files(paths: list[Path], context: str | None, configuration: client.Configuration) -> None:
    joined = os.pathsep.join(str(p) for p in paths)
    try:
        if context is None and len(paths) > 1:
            # kubectl takes the first current-context in $KUBECONFIG's order; the client would take the last.
            context = _first_current_context(paths)
        # The client merges a pathsep-separated list the way kubectl merges $KUBECONFIG.
        kube_config.load_kube_config(config_file=joined, context=context,  # type: ignore[no-untyped-call]
                                     client_configuration=configuration, persist_config=False)
    except (ConfigException, OSError, yaml.YAMLError) as exc:
        detail = str(exc).strip().rstrip(".")
        raise KubeConfigError(f"Cannot load the Kubernetes configuration from {joined} ({detail}); fix the file, or "
                              "pass --kubeconfig or --context to choose another cluster.") from None


def _in_cluster(service_account_dir: Path, configuration: client.Configuration) -> None:
    loader = incluster_config.InClusterConfigLoader(  # type: ignore[no-untyped-call]
        token_filename=str(service_account_dir / "token"), cert_filename=str(service_account_dir / "ca.crt"),
        environ=os.environ)
    try:
        loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError) as exc:
        detail = str(exc).strip().rstrip(".")
        raise KubeConfigError(f"Cannot use the pod's service account in {service_account_dir} ({detail}); mount "
                              "the service account token, or pass --kubeconfig.") from None


def load_configuration(kubeconfig: str | Path | None = None, context: str | None = None, *,
                       service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> client.Configuration:
    """The client configuration for the cluster that kubectl would talk to with the same flags and environment."""
    configuration = client.Configuration()
    tried: list[str] = []
    if kubeconfig is not None:
        path = Path(kubeconfig).expanduser()
        if not path.is_file():
            raise KubeConfigError(f"Cannot load the Kubernetes configuration from {path}: there is no such file; "
                                  "pass --kubeconfig with the path of a kubeconfig file.")
        _from_files([path], context, configuration)
    elif os.environ.get("KUBECONFIG"):
        listed = [Path(p).expanduser() for p in os.environ["KUBECONFIG"].split(os.pathsep) if p]
        existing = [p for p in listed if p.is_file()]
        if existing:
            _from_files(existing, context, configuration)
        else:
            tried.append(f"$KUBECONFIG ({os.environ['KUBECONFIG']}, no such file)")
    elif (home := Path("~/.kube/config").expanduser()).is_file():
        _from_files([home], context, configuration)
    else:
        tried.append(f"{home} (no such file)")
    if tried:
        if context is not None:
            raise KubeConfigError(f"--context {context} names a kubeconfig context, but there is no kubeconfig: "
                                  f"tried {tried[0]}; pass --kubeconfig with the file that defines it.")
        if not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise KubeConfigError(f"Cannot find a Kubernetes cluster: tried {tried[0]}, and this is not a pod "
                                  "($KUBERNETES_SERVICE_HOST is not set); pass --kubeconfig, or set $KUBECONFIG.")
        _in_cluster(service_account_dir, configuration)
    # One attempt per call: urllib3's hidden retries would outlast the timeout the caller chose.
    configuration.retries = False
    return configuration


def connect(kubeconfig: str | Path | None = None, context: str | None = None, *, connections: int | None = None,
            service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> Kube:
    """The cluster kubectl would talk to, ready for gpushare's calls (see ``load_configuration``).

    ``connections``: how many calls may be open at once, watches included, when that is more than the client's
    default pool (five per core) keeps: past the pool, urllib3 opens a connection per call and closes it after,
    warning each time.
    """
    configuration = load_configuration(kubeconfig, context, service_account_dir=service_account_dir)
    if connections is not None:
        configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, connections)
    return Kube.from_api_client(client.ApiClient(configuration))
