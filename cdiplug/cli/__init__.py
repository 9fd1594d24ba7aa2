"""The ``cdiplug`` command line: one subcommand per module in this package.

Each module here defines ``register(subparsers)``, which adds its subcommand(s) and sets ``func``
(``func(args) -> int``) on the parser. Modules are found by listing the package, so adding a
subcommand touches no shared file. Every flag also reads ``CDIPLUG_<FLAG>`` from the environment;
a flag on the command line wins. Exit status 2 means bad arguments or configuration.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .. import signals

if TYPE_CHECKING:
    from ..world import World

# Kept here rather than imported from cdiplug.world: importing it (attrs) before main() runs would
# delay the early signal handlers of ``cdiplug serve`` (test_cli checks these stay equal).
DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_CDI_DIR = Path("/var/run/cdi")
DEFAULT_STATE_DIR = Path("/var/lib/cdiplug")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_PLUGINS_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")

EXIT_USAGE = 2


def env_default(flag: str, default: str | None = None) -> str | None:
    """The default of ``--some-flag``: ``$CDIPLUG_SOME_FLAG`` when set, else ``default``."""
    return os.environ.get("CDIPLUG_" + flag.lstrip("-").replace("-", "_").upper(), default)


def add_option(parser: argparse.ArgumentParser, flag: str, default: str | None = None, **kwargs: object) -> None:
    """Add ``flag`` whose default comes from its environment variable, then ``default``."""
    env = "CDIPLUG_" + flag.lstrip("-").replace("-", "_").upper()
    help_text = str(kwargs.pop("help", ""))
    help_text += f" (env {env}" + (f"; default {default})" if default is not None else ")")
    parser.add_argument(flag, default=env_default(flag, default), help=help_text, **kwargs)  # type: ignore[arg-type]


def add_config_option(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--config", help="configuration file (YAML); without it, the built-in default")


def add_world_options(parser: argparse.ArgumentParser) -> None:
    """The folders of DESIGN.md's command-line contract."""
    add_option(parser, "--kubelet-dir", str(DEFAULT_KUBELET_DIR), help="kubelet device-plugin folder")
    add_option(parser, "--cdi-dir", str(DEFAULT_CDI_DIR), help="folder for CDI specs")
    add_option(parser, "--state-dir", str(DEFAULT_STATE_DIR), help="folder for cdiplug's own state")
    add_option(parser, "--sysfs-root", "/sys", help="where sysfs is mounted")
    add_option(parser, "--dev-root", "/", help="root under which /dev paths are looked up")
    add_option(parser, "--pod-resources-socket", str(DEFAULT_POD_RESOURCES_SOCKET), help="kubelet pod-resources socket")


def add_dra_options(parser: argparse.ArgumentParser) -> None:
    """The node and folders DRA needs (resources with ``api: dra``)."""
    add_option(parser, "--node-name", help="this node's name (default $NODE_NAME, else the host name)")
    add_option(parser, "--kubeconfig", help="kubeconfig for the API server (default: in-cluster, else $KUBECONFIG)")
    add_option(parser, "--plugins-registry-dir", str(DEFAULT_PLUGINS_REGISTRY_DIR), help="kubelet plugin registration folder")
    add_option(parser, "--plugins-dir", str(DEFAULT_PLUGINS_DIR), help="kubelet plugins folder (DRA sockets)")


def world_from_args(args: argparse.Namespace) -> World:
    from ..world import World, default_node_name

    dra: dict[str, object] = {}
    if hasattr(args, "plugins_dir"):  # commands with add_dra_options
        kubeconfig = getattr(args, "kubeconfig", None)
        dra = {
            "node_name": args.node_name or default_node_name(),
            "kubeconfig": Path(kubeconfig) if kubeconfig else None,
            "plugins_registry_dir": Path(args.plugins_registry_dir),
            "plugins_dir": Path(args.plugins_dir),
        }
    return World(
        kubelet_dir=Path(args.kubelet_dir),
        cdi_dir=Path(args.cdi_dir),
        state_dir=Path(args.state_dir),
        sysfs_root=Path(args.sysfs_root),
        dev_root=Path(args.dev_root),
        pod_resources_socket=Path(args.pod_resources_socket),
        **dra,  # type: ignore[arg-type]
    )


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand; with ``command``, of that one alone when a module has its name.

    Importing a subcommand's module costs start-up time (``node-capacity`` brings urllib, say):
    ``cdiplug serve`` builds only its own parser. Anything else (help, a typo) gets them all.
    """
    parser = argparse.ArgumentParser(prog="cdiplug", description="Kubernetes device plugin daemon with CDI support")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = (command or "").replace("-", "_")
    # A named subcommand's module is looked for directly: listing the package (pkgutil) costs
    # ``cdiplug serve`` milliseconds of start-up for nothing.
    if wanted.isidentifier() and not wanted.startswith("_") and importlib.util.find_spec(f"{__name__}.{wanted}") is not None:
        names = [wanted]
    else:
        import pkgutil

        names = sorted(info.name for info in pkgutil.iter_modules(__path__))
    for name in names:
        module = importlib.import_module(f"{__name__}.{name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def _version() -> str:
    from .. import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and not signals.installed() and next((w for w in sys.argv[1:] if not w.startswith("-")), None) == "serve":
        # The process's own command line (never a caller's argv: a test's process keeps its
        # signals); cdiplug.__main__ did this earlier already. Before anything slow (building
        # the parser imports every subcommand): a SIGHUP or SIGTERM during start-up must not end
        # the daemon uncleanly (cdiplug.signals).
        signals.install_early()
    from ..errors import ConfigError

    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(next((w for w in words if not w.startswith("-")), None))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"cdiplug {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `cdiplug cdi list | head`: the reader left; say nothing more, and keep Python from
        # complaining again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
