"""``python -m cdiplug`` and the ``cdiplug`` console script: :func:`main`.

For ``serve``, the early signal handlers go in before anything else is imported
(``cdiplug.toolkit.signals``): a SIGHUP in the first milliseconds must not end the daemon.
"""

import sys


def main() -> int:
    if next((w for w in sys.argv[1:] if not w.startswith("-")), None) == "serve":
        from cdiplug.toolkit import signals

        signals.install_early()
    from cdiplug.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
