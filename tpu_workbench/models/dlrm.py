"""DLRM (Naumov et al. 2019, arXiv:1906.00091) in plain PyTorch, on generated click data.

Dense features go through a bottom MLP, each sparse feature looks up a bag of rows in its own
embedding table and sums them (``nn.EmbeddingBag(mode="sum")``'s semantics), every pair of the
resulting vectors (the bottom MLP's output included) is dotted, and the top MLP turns the dots
and the dense vector into a click logit trained with binary cross-entropy.

Tables are held one of two ways (option ``stack_tables``):

* stacked (``tiny``): one parameter ``embedding.weight`` of shape [tables, rows, dim], every
  table padded to the largest one's rows, looked up with one gather. A strategy can split any
  of its three dims: whole tables (``table``), rows (``row``) or columns (``column``) per device.
* separate (``mlperf``): one ``nn.EmbeddingBag`` per table, [rows_t, dim], no padding (looked
  up as a gather and a sum: torch_xla 2.9 runs ``_embedding_bag`` on the CPU): rows or
  columns can be split, whole tables cannot: under GSPMD every device runs one program with a
  buffer of every parameter's per-device shape, so a tensor placed on one device only would
  still be allocated on all of them. Whole tables per device needs the tables stacked.

Task: each row of each table carries a hidden score (a fixed seed), the dense features a hidden
linear score, and two tables a hidden pairwise interaction; the click is drawn from the sigmoid
of their sum. Row ids follow a power law, as ids in click logs do. ``tiny`` (8 tables of 1024
rows, dim 16) reaches a held-out AUC of about 0.84 in 60 steps (a model that guesses: 0.5).

``mlperf`` has the shape of MLPerf Training's DLRM on Criteo 1TB: 26 tables with the row counts
of mlcommons/training ``recommendation_v2/torchrec_dlrm`` (``--num_embeddings_per_feature``,
also torchrec's ``examples/dlrm``; five tables of 40M rows), embedding dim 128, bottom MLP
13-512-256-128, top MLP 1024-1024-512-256-1 (the dot-interaction DLRM of MLPerf v1's reference;
v2 replaced the dots with a DCNv2 cross network). One-hot lookups as in that reference's
Criteo data. Built on the meta device for layouts, fit and prediction, never trained here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import SpecError
from .base import Batch, EmbeddingTables, ModelFamily

if TYPE_CHECKING:
    import torch
    from torch import nn

# mlcommons/training recommendation_v2/torchrec_dlrm (MLPerf DLRM-DCNv2, Criteo 1TB).
MLPERF_ROWS = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282,
               10, 2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108,
               36)


@dataclass(frozen=True)
class DLRMConfig:
    table_rows: tuple[int, ...] = (1024,) * 8
    embedding_dim: int = 16
    bottom_mlp: tuple[int, ...] = (64,)  # hidden widths; the last layer outputs embedding_dim
    top_mlp: tuple[int, ...] = (64, 32)  # hidden widths; a final layer outputs the logit
    dense_features: int = 13
    bag_size: int = 2  # ids looked up (and summed) per table and sample
    stack_tables: bool = True
    row_multiple: int = 1  # each table's rows rounded up to a multiple (padding never looked up)
    zipf: float = 1.0  # exponent of the ids' power law (0: uniform)
    batch_size: int = 128


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def padded_rows(cfg: DLRMConfig) -> tuple[int, ...]:
    """Each table's rows as the model allocates them: rounded up to ``row_multiple``, and to the
    largest table's where the tables are stacked."""
    m = cfg.row_multiple
    rows = tuple(-(-r // m) * m for r in cfg.table_rows)
    return (max(rows),) * len(rows) if cfg.stack_tables else rows


def _mlp(widths: list[int], last_relu: bool) -> nn.Sequential:
    from torch import nn

    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _stacked_lookup(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[B, T, L] ids into a [T, R, D] stack -> [B, T, D]: one gather, then the bag's sum."""
    import torch

    tables = torch.arange(weight.shape[0], device=ids.device).view(1, -1, 1)
    return weight[tables, ids].sum(dim=2)


def build_net(cfg: DLRMConfig) -> nn.Module:
    import torch
    import torch.nn.functional as F
    from torch import nn

    rows, T, D = padded_rows(cfg), len(cfg.table_rows), cfg.embedding_dim
    pairs = (T + 1) * T // 2

    class DLRM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bottom = _mlp([cfg.dense_features, *cfg.bottom_mlp, D], last_relu=True)
            if cfg.stack_tables:
                self.embedding = nn.Module()
                self.embedding.weight = nn.Parameter(torch.randn(T, rows[0], D) * D**-0.5)
            else:
                self.embedding = nn.ModuleList(nn.EmbeddingBag(r, D, mode="sum") for r in rows)
            self.top = _mlp([D + pairs, *cfg.top_mlp, 1], last_relu=False)
            self.register_buffer("pair_i", torch.triu_indices(T + 1, T + 1, 1)[0],
                                 persistent=False)
            self.register_buffer("pair_j", torch.triu_indices(T + 1, T + 1, 1)[1],
                                 persistent=False)
            # What sharding's embedding strategies split (tpu_workbench.sharding.embedding).
            self.embedding_axes = embedding_axes(cfg)

        def lookup(self, ids: torch.Tensor) -> torch.Tensor:
            if cfg.stack_tables:
                return _stacked_lookup(self.embedding.weight, ids)
            # nn.EmbeddingBag(mode="sum")'s result as a gather and a sum: torch_xla 2.9 runs
            # `_embedding_bag` and its backward outside XLA (a CPU fallback per table, seen).
            return torch.stack([F.embedding(ids[:, t], bag.weight).sum(1)
                                for t, bag in enumerate(self.embedding)], 1)

        def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            x = self.bottom(dense)  # [B, D]
            z = torch.cat([x.unsqueeze(1), self.lookup(ids)], dim=1)  # [B, T + 1, D]
            dots = torch.bmm(z, z.transpose(1, 2))[:, self.pair_i, self.pair_j]  # [B, pairs]
            return self.top(torch.cat([x, dots], dim=1)).squeeze(1)

    return DLRM()


def embedding_axes(cfg: DLRMConfig) -> dict[str, tuple[str, ...]]:
    """Parameter name -> the role of each of its dims (``table``, ``row``, ``column``)."""
    if cfg.stack_tables:
        return {"embedding.weight": ("table", "row", "column")}
    return {f"embedding.{t}.weight": ("row", "column") for t in range(len(cfg.table_rows))}


def auc(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Area under the ROC curve, rank-based (Mann-Whitney U), ties given their mid-rank."""
    import torch

    s = scores.detach().float().flatten()
    y = labels.flatten().float()
    ordered = torch.sort(s).values
    lo = torch.searchsorted(ordered, s, right=False).float()
    hi = torch.searchsorted(ordered, s, right=True).float()
    ranks = (lo + hi + 1) / 2  # 1-based mid-ranks
    n_pos = y.sum()
    n_neg = y.numel() - n_pos
    u = (ranks * y).sum() - n_pos * (n_pos + 1) / 2
    return u / (n_pos * n_neg).clamp(min=1)


class DLRMFamily(ModelFamily):
    name = "dlrm"
    presets = {
        "tiny": DLRMConfig(),
        "mlperf": DLRMConfig(table_rows=MLPERF_ROWS, embedding_dim=128, bottom_mlp=(512, 256),
                             top_mlp=(1024, 1024, 512, 256), bag_size=1, stack_tables=False,
                             row_multiple=128, batch_size=2048),
    }
    item_unit = "samples"
    default_lr = 3e-3
    metric_name = "auc"
    table_wise_options = {"stack_tables": True}  # what makes whole tables per device possible
    eval_items = 4096  # an AUC near 0.75 on 4096 samples is known to about +-0.01

    def check_config(self, cfg: DLRMConfig) -> None:
        for key in ("embedding_dim", "dense_features", "bag_size", "row_multiple",
                    "batch_size"):
            if not _positive(getattr(cfg, key)):
                raise SpecError(f"dlrm {key} must be a positive int, got "
                                f"{getattr(cfg, key)!r}")
        for key in ("table_rows", "bottom_mlp", "top_mlp"):
            value = getattr(cfg, key)
            if not isinstance(value, tuple | list) or not all(map(_positive, value)) or (
                    key == "table_rows" and len(value) < 2):
                raise SpecError(f"dlrm {key} must be a tuple of positive ints"
                                + (" (at least 2 tables)" if key == "table_rows" else "")
                                + f", got {value!r}")
        if not isinstance(cfg.stack_tables, bool):
            raise SpecError(f"dlrm stack_tables must be True or False, got {cfg.stack_tables!r}")
        if not isinstance(cfg.zipf, int | float) or cfg.zipf < 0:
            raise SpecError(f"dlrm zipf must be a number >= 0, got {cfg.zipf!r}")

    def config(self, preset: str, **overrides: object) -> DLRMConfig:
        for key in ("table_rows", "bottom_mlp", "top_mlp"):  # JSON gives lists back
            if isinstance(overrides.get(key), list):
                overrides[key] = tuple(overrides[key])  # type: ignore[arg-type]
        return super().config(preset, **overrides)

    def build(self, cfg: DLRMConfig) -> nn.Module:
        return build_net(cfg)

    def embedding_tables(self, cfg: DLRMConfig) -> list[EmbeddingTables]:
        rows = padded_rows(cfg)
        axes = embedding_axes(cfg)
        if cfg.stack_tables:
            return [EmbeddingTables("embedding.weight", axes["embedding.weight"], rows,
                                    cfg.embedding_dim)]
        return [EmbeddingTables(name, roles, (r,), cfg.embedding_dim)
                for (name, roles), r in zip(axes.items(), rows, strict=True)]

    def batch_shapes(self, cfg: DLRMConfig,
                     batch_size: int) -> dict[str, tuple[tuple[int, ...], str]]:
        return {"dense": ((batch_size, cfg.dense_features), "float32"),
                "ids": ((batch_size, len(cfg.table_rows), cfg.bag_size), "int64"),
                "y": ((batch_size,), "float32")}

    def _hidden(self, cfg: DLRMConfig) -> dict[str, torch.Tensor]:
        """The planted task: per-row scores, a dense weight, an interaction of tables 0 and 1."""
        import torch

        g = torch.Generator().manual_seed(4321)
        k = 4
        return {"dense": torch.randn(cfg.dense_features, generator=g) / cfg.dense_features**0.5,
                "rows": [torch.randn(r, generator=g) for r in cfg.table_rows],
                "u0": torch.randn(cfg.table_rows[0], k, generator=g) / k**0.5,
                "u1": torch.randn(cfg.table_rows[1], k, generator=g) / k**0.5}

    def make_batch(self, cfg: DLRMConfig, batch_size: int, generator: torch.Generator) -> Batch:
        import torch

        h = self._hidden(cfg)
        B, L = batch_size, cfg.bag_size
        dense = torch.randn(B, cfg.dense_features, generator=generator)
        ids, table_score = [], torch.zeros(B)
        for r, scores in zip(cfg.table_rows, h["rows"], strict=True):
            p = (torch.arange(1, r + 1, dtype=torch.float64) ** -cfg.zipf)
            t_ids = torch.multinomial(p, B * L, replacement=True, generator=generator).view(B, L)
            ids.append(t_ids)
            table_score += scores[t_ids].mean(1)
        inter = (h["u0"][ids[0][:, 0]] * h["u1"][ids[1][:, 0]]).sum(1)
        logit = dense @ h["dense"] + 0.6 * table_score / len(ids) ** 0.5 + inter - 0.3
        y = (torch.rand(B, generator=generator) < torch.sigmoid(2 * logit)).float()
        return {"dense": dense, "ids": torch.stack(ids, 1), "y": y}

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        import torch.nn.functional as F

        return F.binary_cross_entropy_with_logits(model(batch["dense"], batch["ids"]),
                                                  batch["y"])

    def evaluate(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """AUC of one batch (:meth:`evaluate_batches` pools the whole held-out set)."""
        return auc(model(batch["dense"], batch["ids"]), batch["y"])

    def evaluate_batches(self, model: nn.Module, batches: list[Batch]) -> torch.Tensor:
        """AUC over every held-out sample at once (an AUC is not a mean of batch AUCs)."""
        import torch

        scores = torch.cat([model(b["dense"], b["ids"]).to("cpu") for b in batches])
        return auc(scores, torch.cat([b["y"].to("cpu") for b in batches]))

    def flops_per_step(self, cfg: DLRMConfig, batch_size: int) -> float:
        """3 x 2 x the MLPs' and the dots' multiply-adds (lookups move bytes, not FLOPs)."""
        T, D = len(cfg.table_rows), cfg.embedding_dim
        bottom = [cfg.dense_features, *cfg.bottom_mlp, D]
        top = [D + (T + 1) * T // 2, *cfg.top_mlp, 1]
        macs = sum(a * b for w in (bottom, top) for a, b in zip(w[:-1], w[1:], strict=True))
        macs += (T + 1) ** 2 * D
        return 3 * 2.0 * batch_size * macs
