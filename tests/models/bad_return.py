"""A user's model file whose ``make`` returns neither a ModelFamily nor a factory."""

from __future__ import annotations

from torch import nn

not_callable = 42


def make() -> nn.Module:
    return nn.Linear(4, 2)  # a model, not a family: the error says what was expected


def make_half() -> dict:
    return {"build": lambda: nn.Linear(4, 2)}  # a factory without make_batch and loss
