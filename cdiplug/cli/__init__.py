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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cdiplug.toolkit import signals

if TYPE_CHECKING:
    from cdiplug.models.world import World

EXIT_USAGE = 2
LOG_LEVELS = ("debug", "info", "warning", "error")


def env_name(flag: str) -> str:
    """``--some-flag``'s environment variable: ``CDIPLUG_SOME_FLAG``."""
    return "CDIPLUG_" + flag.lstrip("-").replace("-", "_").upper()


def env_default(flag: str, default: str | None = None) -> str | None:
    """The default of ``--some-flag``: ``$CDIPLUG_SOME_FLAG`` when set, else ``default``."""
    return os.environ.get(env_name(flag), default)


def add_option(parser: argparse.ArgumentParser, flag: str, default: str | None = None, **kwargs: object) -> None:
    """Add ``flag`` whose default comes from its environment variable, then ``default``."""
    env = env_name(flag)
    help_text = str(kwargs.pop("help", ""))
    help_text += f" (env {env}" + (f"; default {default})" if default is not None else ")")
    parser.add_argument(flag, default=env_default(flag, default), help=help_text, **kwargs)  # type: ignore[arg-type]


def path_type(flag: str, absolute: bool) -> Callable[[str], str]:
    """The argparse ``type`` of a path flag: never empty; a node's folder or socket must be absolute.

    argparse applies it to a string default too, so a value from ``$CDIPLUG_<FLAG>`` is checked
    the same way; its message names both, since it cannot tell which one gave the value.
    """

    def check(value: str) -> str:
        where = f"(from {flag} or ${env_name(flag)})"
        if not value.strip():
            raise argparse.ArgumentTypeError(f"an empty path {where}")
        if "\0" in value:
            raise argparse.ArgumentTypeError(f"{value!r} {where}: a path cannot hold a NUL character")
        if absolute and not value.startswith("/"):
            raise argparse.ArgumentTypeError(
                f"{value!r} {where} is a relative path; give an absolute one (it is a path on the node, as the kubelet sees it)"
            )
        return value

    return check


def add_path_option(
    parser: argparse.ArgumentParser, flag: str, default: str | None = None, *, absolute: bool = True, help: str = ""
) -> None:
    """A path flag (with its environment variable), checked as :func:`path_type` says."""
    add_option(
        parser, flag, default, help=help, type=path_type(flag, absolute), metavar="PATH" if not flag.endswith("dir") else "DIR"
    )


def add_config_option(parser: argparse.ArgumentParser) -> None:
    add_path_option(parser, "--config", absolute=False, help="configuration file (YAML); without it, the built-in default")


def world_default(field: str) -> str:
    """The default of a :class:`~cdiplug.models.world.World` folder, the one source of them.

    Imported when a parser is built, not with this package: ``import cdiplug.cli`` stays free of
    attrs until ``main`` has installed the early signal handlers.
    """
    import attrs

    from cdiplug.models.world import World

    return str(attrs.fields_dict(World)[field].default)


# The node's folders of the command-line contract: World field -> help.
WORLD_OPTIONS = {
    "kubelet_dir": "kubelet device-plugin folder",
    "cdi_dir": "folder for CDI specs",
    "state_dir": "folder for cdiplug's own state",
    "sysfs_root": "where sysfs is mounted",
    "dev_root": "root under which /dev paths are looked up",
    "pod_resources_socket": "kubelet pod-resources socket",
}
# What running the backends once needs (discover, cdi generate, vfio): no kubelet, no CDI folder.
BACKEND_WORLD = ("state_dir", "sysfs_root", "dev_root", "instance")


def add_world_options(parser: argparse.ArgumentParser, fields: Sequence[str] = (*WORLD_OPTIONS, "instance")) -> None:
    """The folders of the command-line contract (``docs/architecture.md``) that a command uses,
    and ``--instance`` when ``fields`` names it."""
    for name in fields:
        if name == "instance":
            add_option(
                parser,
                "--instance",
                "",
                help="this deployment's name on the node (a DNS label, e.g. the Helm release): the CDI specs, state and "
                "locks it keeps in shared folders are named by it, so deployments never touch each other's files; "
                "empty: the default instance, whose files keep their plain names",
            )
        else:
            add_path_option(parser, "--" + name.replace("_", "-"), world_default(name), help=WORLD_OPTIONS[name])


def add_log_level(parser: argparse.ArgumentParser, default: str = "warning") -> None:
    """``--log-level``, the same on every command (``serve`` logs at ``info``, the others at ``warning``)."""
    add_option(parser, "--log-level", default, choices=LOG_LEVELS, help="least severe log records shown")


def log_level(args: argparse.Namespace) -> int:
    """The level ``--log-level`` (or its environment variable, which argparse does not check) names."""
    import logging

    from cdiplug.errors import ConfigError

    value = str(getattr(args, "log_level", None) or "warning")
    if value.lower() not in LOG_LEVELS:
        raise ConfigError(f"--log-level (or $CDIPLUG_LOG_LEVEL) must be one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return int(getattr(logging, value.upper()))


def plain(text: str) -> str:
    """A docstring made fit for ``--help``: no reStructuredText markup (double backticks, roles)."""
    import re

    text = re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: m.group(1).rpartition(".")[2] if "." in m.group(1) else m.group(1), text)
    return text.replace("``", "")


def describe(doc: str | None, paragraph: int = 0) -> str:
    """Paragraph ``paragraph`` of a module docstring as a command's ``--help`` description."""
    paragraphs = (doc or "").split("\n\n")
    return plain(paragraphs[paragraph] if paragraph < len(paragraphs) else "")


KUBECONFIG_HELP = "kubeconfig file; without it, as kubectl: $KUBECONFIG, ~/.kube/config, then the in-cluster service account"


def add_plugin_folders(parser: argparse.ArgumentParser) -> None:
    """The kubelet's plugin registration and plugins folders (DRA sockets)."""
    add_path_option(
        parser, "--plugins-registry-dir", world_default("plugins_registry_dir"), help="kubelet plugin registration folder"
    )
    add_path_option(parser, "--plugins-dir", world_default("plugins_dir"), help="kubelet plugins folder (DRA sockets)")


def add_configuration_options(parser: argparse.ArgumentParser) -> None:
    """``--config`` and ``--configuration`` (which named configuration of the file)."""
    add_config_option(parser)
    parser.add_argument(
        "--configuration", metavar="NAME", help="the named configuration to use (as the node label cdiplug.dev/config chooses)"
    )


def add_dra_options(parser: argparse.ArgumentParser) -> None:
    """The node and folders DRA needs (resources with ``api: dra``)."""
    add_option(parser, "--node-name", help="this node's name (default $NODE_NAME, else the host name)")
    add_path_option(parser, "--kubeconfig", absolute=False, help=KUBECONFIG_HELP)
    add_plugin_folders(parser)
    add_option(
        parser,
        "--pod-uid",
        help="this pod's UID (metadata.uid): DRA sockets carry it, so an old and a new pod serve side by side",
    )


def world_from_args(args: argparse.Namespace) -> World:
    """The world of the command line; ConfigError for a bad ``--pod-uid``."""
    from cdiplug.errors import ConfigError
    from cdiplug.models.world import World, default_node_name, instance_problem, pod_uid_problem

    dra: dict[str, object] = {}
    if hasattr(args, "plugins_dir"):  # commands with add_dra_options (or its folders)
        kubeconfig = getattr(args, "kubeconfig", None)
        dra = {
            "node_name": getattr(args, "node_name", None) or default_node_name(),
            "kubeconfig": Path(kubeconfig) if kubeconfig else None,
            "plugins_registry_dir": Path(args.plugins_registry_dir),
            "plugins_dir": Path(args.plugins_dir),
        }
        pod_uid = getattr(args, "pod_uid", None) or None
        if pod_uid is not None:
            if (problem := pod_uid_problem(pod_uid)) is not None:
                raise ConfigError(f"--pod-uid (or $CDIPLUG_POD_UID): {problem}")
            dra["pod_uid"] = pod_uid
    instance = getattr(args, "instance", None) or ""
    if (problem := instance_problem(instance)) is not None:
        raise ConfigError(f"--instance (or $CDIPLUG_INSTANCE): {problem}")
    folders = {name: Path(getattr(args, name)) for name in WORLD_OPTIONS if getattr(args, name, None) is not None}
    return World(**folders, instance=instance, **dra)  # type: ignore[arg-type]


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


def _setup_logging(args: argparse.Namespace) -> None:
    """Log records at ``--log-level`` and above to stderr, as ``--log-format`` says (text without it)."""
    from cdiplug.errors import ConfigError
    from cdiplug.toolkit.logs import FORMATS, setup_logging

    fmt = getattr(args, "log_format", None) or "text"
    if fmt not in FORMATS:  # a bad $CDIPLUG_LOG_FORMAT skips argparse's choices check
        raise ConfigError(f"--log-format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    setup_logging(fmt, log_level(args))


def _version() -> str:
    from cdiplug import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and not signals.installed() and next((w for w in sys.argv[1:] if not w.startswith("-")), None) == "serve":
        # The process's own command line (never a caller's argv: a test's process keeps its
        # signals); cdiplug.__main__ did this earlier already. Before anything slow (building
        # the parser imports every subcommand): a SIGHUP or SIGTERM during start-up must not end
        # the daemon uncleanly (cdiplug.toolkit.signals).
        signals.install_early()
    from cdiplug.errors import ConfigError

    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(next((w for w in words if not w.startswith("-")), None))
    args = parser.parse_args(argv)
    try:
        if hasattr(args, "log_level"):
            _setup_logging(args)
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
