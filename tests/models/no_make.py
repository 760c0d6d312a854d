"""A user's model file without the ``make`` its ref names."""

from __future__ import annotations


def build_model():
    return None
