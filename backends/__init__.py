"""Hardware backends for cdiplug, one subpackage each, registered under ``cdiplug.backends``.

They depend on ``cdiplug``; ``cdiplug`` never imports them, and they never import each other.
"""
