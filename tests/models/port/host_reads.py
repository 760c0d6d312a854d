"""Every way a training step reads a device tensor back on the host, one per line: the planted
set of ``tests/test_port.py`` (its expected findings: ``host_reads.expected.csv``).

Two lines read and must not be blamed: ``float(probs[0, 0])`` reads a tensor already on the CPU
(``.cpu()`` copied it on the line before), and the label read is of the input batch, which is
device data the step did not compute: no execution, but one transfer (so it is blamed, as a
read that executes nothing).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

DIM, CLASSES = 8, 4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if h.mean() > 0:  # a tensor in a condition
            h = h * 1.5
        return h


def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["x"])
    out = F.cross_entropy(logits, batch["y"])
    preds = logits.argmax(-1).tolist()  # .tolist()
    probs = logits.softmax(-1).cpu()  # .cpu()
    top = float(probs[0, 0])  # already on the CPU: no device read
    total = out.item()  # .item()
    scores = (logits * 2).detach().cpu().numpy()  # .numpy()
    mean = float(logits.mean())  # float()
    best = int(logits.argmax())  # int()
    positive = bool(out > 0)  # bool()
    print(out)  # printing a tensor
    copy = (logits + 1).detach().to("cpu")  # .to("cpu")
    labels = batch["y"].tolist()  # the input batch: device data, a transfer and no execution
    del preds, top, total, scores, mean, best, positive, copy, labels
    return out


def build() -> nn.Module:
    return Net()


def make_batch(batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    x = torch.randn(batch_size, DIM, generator=generator)
    return {"x": x, "y": x[:, :CLASSES].argmax(dim=1)}


def make() -> SimpleNamespace:
    return SimpleNamespace(build=build, make_batch=make_batch, loss=loss, batch_size=8,
                           name="host_reads")
