"""``python -m cdiplug`` and the ``cdiplug`` console script: :func:`main`.

For ``serve``, the early signal handlers go in before anything else is imported
(``cdiplug.toolkit.signals``): a SIGHUP in the first milliseconds must not end the daemon.
The garbage collector stays off until the daemon has started (:mod:`cdiplug.daemon`).
"""

import gc
import sys


def main() -> int:
    if next((w for w in sys.argv[1:] if not w.startswith("-")), None) == "serve":
        from cdiplug.toolkit import signals

        signals.install_early()
        # Start-up makes what lives as long as the daemon (modules, classes, the configuration),
        # and the collector would walk it again at every threshold: a third of the start-up time.
        gc.disable()
    from cdiplug.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
