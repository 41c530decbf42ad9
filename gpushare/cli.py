"""The ``gpushare`` command: operator tools that need no running component. Subcommands register on ``app``."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from gpushare import schedconfig
from gpushare.policies import DEFAULT_POLICY, policy_names

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="GPU sharing for Kubernetes: operator tools.")


@app.callback()
def _group() -> None:
    """Keep ``gpushare`` a command group even while it has a single subcommand."""


class Output(StrEnum):
    AUTO = "auto"
    YAML = "yaml"
    JSON = "json"


@app.command("scheduler-config")
def scheduler_config(
    kube_version: Annotated[str, typer.Option(
        help="Version of the kube-scheduler that reads the file, 1.11 or later 1.x, e.g. 1.30 or v1.22.17. Before "
             "1.23 this prints a Policy file, for 1.23 and 1.24 a v1beta3 KubeSchedulerConfiguration, from 1.25 on "
             "a v1 one.")],
    url: Annotated[str | None, typer.Option(
        help="Extender URL prefix; default http(s)://SERVICE.NAMESPACE.svc:PORT/gpushare-scheduler.")] = None,
    service: Annotated[str, typer.Option(help="The extender's Service name.")] = schedconfig.DEFAULT_SERVICE,
    namespace: Annotated[str, typer.Option(
        help="Namespace of the extender's Service and of a second scheduler's lease.")] = schedconfig.DEFAULT_NAMESPACE,
    port: Annotated[int, typer.Option(help="The extender's Service port, 1 to 65535.")] = schedconfig.DEFAULT_PORT,
    https: Annotated[bool, typer.Option("--https", help="Reach the extender over HTTPS.")] = False,
    weight: Annotated[int, typer.Option(
        help="Weight of the extender's scores against the scheduler's plugins, 1 or more.")] = 5,
    http_timeout: Annotated[int, typer.Option(
        help="Seconds kube-scheduler waits for each extender call, 1 or more.")] = 10,
    tls_ca_file: Annotated[str | None, typer.Option(
        help="CA file, on the scheduler's host, that signed the extender's certificate.")] = None,
    tls_server_name: Annotated[str | None, typer.Option(help="Server name to verify the certificate against.")] = None,
    tls_insecure: Annotated[bool, typer.Option("--tls-insecure", help="Skip verifying the certificate.")] = False,
    scheduler_name: Annotated[str | None, typer.Option(
        help=f"Configure a second scheduler that pods opt into with schedulerName (e.g. "
             f"{schedconfig.SECOND_SCHEDULER_NAME}); default: extend the default scheduler.")] = None,
    leader_elect: Annotated[bool, typer.Option(help="Enable leader election.")] = True,
    client_kubeconfig: Annotated[str | None, typer.Option(
        help="kubeconfig kube-scheduler uses to reach the API server, e.g. /etc/kubernetes/scheduler.conf on "
             "kubeadm control planes (kube-scheduler ignores --kubeconfig once it reads --config).")] = None,
    output: Annotated[Output, typer.Option(
        "--output", "-o", help="auto: JSON for a Policy file, YAML otherwise.")] = Output.AUTO,
) -> None:
    """Print the kube-scheduler configuration that plugs the gpushare extender in."""
    ext = schedconfig.ExtenderOptions(
        url_prefix=url or schedconfig.extender_url(service, namespace, port, https),
        weight=weight, http_timeout_seconds=http_timeout, tls_ca_file=tls_ca_file,
        tls_server_name=tls_server_name, tls_insecure=tls_insecure)
    sched = schedconfig.SchedulerOptions(scheduler_name=scheduler_name, leader_elect=leader_elect,
                                         lease_namespace=namespace, client_kubeconfig=client_kubeconfig)
    try:
        _check_flags(kube_version, port, weight, http_timeout)
        if url and https and not url.startswith("https://"):
            raise schedconfig.ConfigError(f"--https contradicts the URL {url!r}; give an https:// URL.")
        doc = schedconfig.scheduler_config(kube_version, ext, sched)
        fmt = output.value
        if output is Output.AUTO:
            fmt = "json" if doc["kind"] == "Policy" else "yaml"
        typer.echo(schedconfig.dump(doc, fmt), nl=False)
    except schedconfig.ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _check_flags(kube_version: str, port: int, weight: int, http_timeout: int) -> None:
    """Refuse out-of-range flags by name, before they end up in a file kube-scheduler rejects much later."""
    try:
        schedconfig.parse_kube_version(kube_version)
    except schedconfig.ConfigError as exc:
        raise schedconfig.ConfigError(f"--kube-version: {exc}") from None
    if not 1 <= port <= 65535:
        raise schedconfig.ConfigError(f"--port {port} is not a TCP port; give one from 1 to 65535.")
    if weight < 1:
        raise schedconfig.ConfigError(f"--weight {weight} is not positive; kube-scheduler needs a weight of 1 or more.")
    if http_timeout < 1:
        raise schedconfig.ConfigError(f"--http-timeout {http_timeout} is not positive; give at least 1 second.")


@app.command("demo")
def demo(
    policy: Annotated[str, typer.Option(help="The extender's placement policy.")] = DEFAULT_POLICY,
    workdir: Annotated[str | None, typer.Option(
        help="Folder for the cluster description, kubeconfig and component logs (default: a new temp folder).")
    ] = None,
) -> None:
    """Run every component on the local cluster with simulated GPUs, submit pods, and show the result."""
    import tempfile
    from pathlib import Path

    from gpushare.localcluster.demo import run_demo

    # The extender would refuse it too, but only after the cluster and device plugins have started.
    if policy not in policy_names():
        typer.echo(f"error: --policy {policy!r} is not a placement policy; choose one of "
                   f"{', '.join(policy_names())}.", err=True)
        raise typer.Exit(1)
    folder = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gpushare-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        run_demo(folder, policy)
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        if not workdir:
            typer.echo(f"The demo's cluster description, kubeconfig and component logs stay in {folder}; "
                       "remove it when done.", err=True)


def main() -> None:
    app()
