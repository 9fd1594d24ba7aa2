"""``python -m cdiplug``: the same as the ``cdiplug`` console script."""

import sys

from .cli import main

sys.exit(main())
