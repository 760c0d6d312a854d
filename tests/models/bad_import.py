"""A user's model file that raises while it is imported (the error must show this traceback)."""

from __future__ import annotations


def _load_settings() -> dict:
    raise RuntimeError("settings.toml not found (raised on purpose by a test)")


SETTINGS = _load_settings()


def make():
    return None
