"""``cdiplug serve``: run the daemon (the command-line contract of ``docs/architecture.md``).

Exit status: 0 after SIGTERM/SIGINT and a clean stop; 2 for a bad configuration (the message names
the field and the file; ``cdiplug.cli.main`` prints it) or a backend that was told to fail when it
cannot start (:class:`BackendInitError`); 1 when the daemon cannot run otherwise (another process
serves on our socket, a backend failed), with the reason logged.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from cdiplug.cli import (
    EXIT_USAGE,
    add_config_option,
    add_dra_options,
    add_log_level,
    add_option,
    add_world_options,
    world_from_args,
)
from cdiplug.errors import BackendInitError, CdiplugError, ConfigError
from cdiplug.toolkit.logs import FORMATS

log = logging.getLogger(__name__)

EXIT_FAILED = 1
M_ARENA_MAX = -8  # glibc's mallopt parameter


def _one_malloc_arena() -> None:
    """One malloc arena for the whole process (glibc; elsewhere nothing happens).

    glibc gives threads arenas of their own: grpc's and ``asyncio.to_thread``'s workers (which
    build CDI specs) would each keep pages of their own arena resident, megabytes in all, for a
    daemon that runs Python in one thread at a time anyway. Called before the daemon starts
    any thread.
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return
    mallopt(M_ARENA_MAX, 1)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the device plugin daemon",
        description="Serve every configured resource to the kubelet until SIGTERM; SIGHUP reloads the configuration.",
    )
    add_config_option(parser)
    add_world_options(parser)
    add_dra_options(parser)
    add_option(parser, "--log-format", "text", choices=FORMATS, help="log lines as text or JSON")
    add_log_level(parser, "info")
    add_option(parser, "--metrics-address", help="serve /metrics, /healthz and /readyz on HOST:PORT")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cdiplug.daemon import serve  # imported here: grpc is not needed to print --help

    # Logging is set up by cdiplug.cli.main (--log-format, --log-level).
    _one_malloc_arena()
    world = world_from_args(args)
    try:
        return asyncio.run(serve(args.config, world, args.metrics_address))
    except ConfigError:
        raise  # cdiplug.cli.main reports it and exits 2
    except BackendInitError as exc:
        # A backend told to fail when it cannot start (fail_on_init_error): a configuration matter.
        log.error("cdiplug serve: %s", exc)
        return EXIT_USAGE
    except CdiplugError as exc:
        log.error("cdiplug serve: %s", exc)
        return EXIT_FAILED
