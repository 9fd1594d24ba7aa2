"""``cdiplug webhook``: the validating admission webhook for our drivers' claim configuration.

Serves ``POST /validate`` over HTTPS for the API server (a ValidatingWebhookConfiguration whose
``matchConditions`` send it only the objects that name one of our drivers; the chart's, or
``deploy/admission``). It reads the same configuration file as ``cdiplug serve``: every named
configuration's DRA resources give the drivers it judges, each with its backend's claim
configuration class, so a claim is refused at admission with the message its prepare would give.
It reads DeviceClasses (``get``) to merge a request's class configuration as the prepare does.
Exit status: 0 after SIGTERM/SIGINT, 2 for a bad configuration or certificate.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cdiplug.cli import KUBECONFIG_HELP, add_config_option, add_log_level, add_option, add_path_option, describe


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "webhook",
        help="serve the admission webhook that refuses bad claim configuration for our DRA drivers",
        description=describe(__doc__, 1),
    )
    add_config_option(parser)
    add_option(parser, "--address", "0.0.0.0:9443", help="HOST:PORT to serve HTTPS on")
    add_path_option(parser, "--tls-cert-file", absolute=False, help="the serving certificate (PEM); re-read when it changes")
    add_path_option(parser, "--tls-private-key-file", absolute=False, help="its private key (PEM)")
    add_path_option(parser, "--kubeconfig", absolute=False, help=KUBECONFIG_HELP + "; only DeviceClasses are read")
    add_option(parser, "--log-format", "text", choices=("text", "json"), help="log lines as text or JSON")
    add_log_level(parser, "info")
    parser.set_defaults(func=run)


def drivers_of(config_path: str | None) -> dict[str, Any]:
    """Our DRA drivers in every named configuration of the file -> :class:`~cdiplug.dra.admission.Driver`."""
    from cdiplug.backend import abilities_of, load_plugins
    from cdiplug.config import load_config
    from cdiplug.dra.admission import Driver
    from cdiplug.dra.settings import driver_of
    from cdiplug.models.resource import Api
    from cdiplug.models.world import World

    plugins = load_plugins()
    first = load_config(config_path, plugins)
    configs = [load_config(config_path, plugins, name) for name in first.names] if first.names else [first]
    out: dict[str, Driver] = {}
    world = World(node_name="admission-webhook")
    for config in configs:
        by_backend: dict[str, list[Any]] = {}
        for r in config.resources:
            if r.api == Api.DRA and driver_of(r) not in out:
                by_backend.setdefault(r.backend, []).append(r)
        for backend_name, resources in by_backend.items():
            # Created, never run: only its claim configuration class is asked for.
            backend = plugins[backend_name].create(resources, world)
            configurable = abilities_of(backend).configurable
            for r in resources:
                out.setdefault(driver_of(r), Driver(r.name, configurable))
    return out


def run(args: argparse.Namespace) -> int:
    from cdiplug.errors import ConfigError
    from cdiplug.telemetry.metrics import parse_address

    # logging is set up by cdiplug.cli.main (--log-format, --log-level)
    if not args.tls_cert_file or not args.tls_private_key_file:
        raise ConfigError("--tls-cert-file and --tls-private-key-file are required (the API server calls webhooks over HTTPS)")
    host, port = parse_address(args.address)
    drivers = drivers_of(args.config)
    if not drivers:
        logging.getLogger(__name__).warning("no resource with api: dra in the configuration: every object is allowed")
    return asyncio.run(_serve(drivers, Path(args.tls_cert_file), Path(args.tls_private_key_file), host, port, args.kubeconfig))


async def _serve(drivers: Mapping[str, Any], cert: Path, key: Path, host: str, port: int, kubeconfig: str | None) -> int:
    from cdiplug.dra.webhook import WebhookServer
    from cdiplug.errors import ConfigError
    from cdiplug.kube.client import KubeClient, connect

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    client: KubeClient | None = None
    try:
        client = connect(kubeconfig)
    except Exception as exc:  # no credentials: the classes' configuration is not merged in
        logging.getLogger(__name__).warning("cannot read DeviceClasses (%s): claims are checked on their own", exc)
    try:
        server = WebhookServer(drivers, cert, key, host, port, client.get_device_class if client else None)
        try:
            async with server:
                await stop.wait()
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot serve on {host}:{port} with {cert}: {exc}") from exc
    finally:
        if client is not None:
            await client.close()
    return 0
