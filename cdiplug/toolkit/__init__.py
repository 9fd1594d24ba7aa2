"""Helpers with no knowledge of devices: files, YAML, signals, logs, supervision, backoff, locks."""
