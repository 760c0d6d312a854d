"""Fuzzed specs: any ExperimentSpec either validates or raises a SpecError that names the bad
field, before any worker starts.

Every field gets valid values, near misses (negative numbers, unknown names, odd meshes such as
(3, 3) or (0,)) and values of the wrong type (strings for ints, bools, None, lists, dicts).
Submitting goes through the real ``wb.submit`` with the pool's ``Worker`` replaced by a stub that
records the attempt instead of starting a process: a spec that gets that far was valid.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import tpu_workbench as wb
from tpu_workbench.runs import gang, workers

FIELDS = [f.name for f in dataclasses.fields(wb.ExperimentSpec)]
# How messages spell a field when they do not use its name.
ALIASES = {"xla_flags": ("xla flag",), "options": ("option", "options")}

junk = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70), st.floats(allow_nan=True),
    st.text(max_size=6), st.sampled_from(["", "8", "2x4", "-1", "hlo", "--xla_foo", "tiny"]),
    st.lists(st.integers(-1, 4), max_size=3), st.lists(st.text(max_size=3), max_size=2),
    st.tuples(st.integers(-1, 4)), st.dictionaries(st.text(max_size=3), st.none(), max_size=2),
)
small = st.integers(-2, 40)
option_keys = st.sampled_from(["n_layer", "n_head", "n_embd", "vocab_size", "block_size",
                               "length", "n_digits", "batch_size", "attention", "d_in",
                               "d_hidden", "n_classes", "arch", "image_size", "num_classes",
                               "cifar_stem", "block_out_channels", "attn_levels",
                               "mid_attention", "norm_num_groups", "nonsense", ""])
option_values = st.one_of(small, st.booleans(), st.none(), st.sampled_from(
    ["xla", "pallas", "resnet18", "2", "x"]), st.floats(allow_nan=True),
    st.lists(st.integers(-1, 64), max_size=3).map(tuple))
meshes = st.one_of(st.none(), st.sampled_from([(8,), (2, 4), (4, 2), (1, 8), (3, 3), (0,), (),
                                               (2, 2, 2), (2, -4), (True, 8), (2.0, 4)]),
                   st.lists(st.integers(-1, 9), max_size=3).map(tuple))
flags = st.one_of(st.sampled_from([(), (), ("--xla_cpu_use_thunk_runtime=true",),
                                   ("--xla_dump_too=/tmp",), ("garbage",), ("--XLA_BAD",),
                                   (5,), "--xla_cpu_use_thunk_runtime=true --xla_foo"]),
                  st.text(max_size=12), st.lists(st.text(max_size=8), max_size=2).map(tuple))
captures = st.one_of(st.sampled_from(["hlo", "profile", "checkpoint", "flamegraph", "",
                                      ("hlo",), ("hlo", "profile"), ("checkpoint",), ("h",)]),
                     st.lists(st.sampled_from(["hlo", "profile", "checkpoint", "x"]),
                              max_size=3).map(tuple))


def mostly(usual, other):
    """`usual` three times in four, else `other`."""
    return st.one_of(usual, usual, usual, other)


# Plausible values of every field, near misses included (unknown names, negative numbers,
# meshes that do not fit, combinations that do not go together).
PLAUSIBLE = {
    "model": mostly(st.sampled_from(["mingpt", "mlp"]), st.sampled_from(["resnet", "unet",
                                                                         "gpt5"])),
    "preset": mostly(st.just("tiny"), st.sampled_from(["gpt-mini", "huge"])),
    "mode": mostly(st.sampled_from(["compile", "lazy", "eager", "torch_eager"]),
                   st.sampled_from([*wb.MODES, "jit"])),
    "steps": mostly(st.integers(1, 30), small),
    "batch_size": mostly(st.sampled_from([None, 8, 16, 32]), small),
    "seed": mostly(st.integers(0, 10), st.integers(-(2**64), 2**65)),
    "device": mostly(st.sampled_from(["auto", "cpu"]), st.sampled_from(["tpu", "cuda", "gpu"])),
    "num_devices": mostly(st.just(8), st.sampled_from([1, 2, 4, 9, 0, -8, 65])),
    "mesh": mostly(st.sampled_from([None, None, (8,), (2, 4), (4, 2), (1, 8)]), meshes),
    "strategy": mostly(st.sampled_from([None, "dp", "fsdp", "tp", "dp_tp"]), st.just("zero3")),
    "xla_flags": mostly(st.just(()), flags),
    "capture": mostly(st.sampled_from([(), ("profile",), ("hlo",)]), captures),
    "options": mostly(st.just({}), st.dictionaries(option_keys, option_values, max_size=3)),
    "lr": mostly(st.one_of(st.none(), st.floats(1e-5, 1.0)),
                 st.floats(allow_nan=True, allow_infinity=True)),
    "optimizer": mostly(st.sampled_from(["adamw", "adafactor"]), st.just("sgd")),
    "change": mostly(st.none(), st.sampled_from([*wb.CHANGES, "colour"])),
    "change_at": mostly(st.integers(1, 5), small),
    "explain_compiles": st.sampled_from([None, True, False]),
    "persistent_cache": mostly(st.just(False), st.just(True)),
}
assert set(PLAUSIBLE) == set(FIELDS)


S = wb.ExperimentSpec
VALID = [  # specs that validate here, to start from
    S(), S(model="mlp", mode="lazy", steps=3), S(mesh=(2, 4), strategy="dp_tp"),
    S(mesh=(8,), strategy="fsdp", capture=("hlo",)), S(mode="torch_eager", capture=("profile",)),
    S(change="item", change_at=2, steps=4), S(model="unet", mode="eager", seed=7),
    S(model="resnet", capture=("hlo", "checkpoint"), lr=0.01,
      xla_flags=("--xla_cpu_use_thunk_runtime=true",)),
    S(model="mlp", num_devices=4, mesh=(2, 2), strategy="tp", options={"d_hidden": 64}),
]


@st.composite
def specs(draw):
    """Either a valid spec with up to three fields changed to plausible values or junk, or a
    spec of plausible values throughout with up to two fields of junk."""
    if draw(st.booleans()):
        n = draw(st.sampled_from([0, 1, 1, 1, 2, 3]))
        changes = {name: draw(mostly(PLAUSIBLE[name], junk)) for name in
                   draw(st.lists(st.sampled_from(FIELDS), min_size=n, max_size=n, unique=True))}
        return dataclasses.replace(draw(st.sampled_from(VALID)), **changes)
    kwargs = {name: draw(values) for name, values in PLAUSIBLE.items()}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=2, unique=True)):
        kwargs[name] = draw(junk)
    return wb.ExperimentSpec(**kwargs)


class WouldStart(Exception):
    """Raised by the stub Worker: the spec passed validation and a worker would start now."""


class NoWorker:
    started: list = []

    def __init__(self, config):
        NoWorker.started.append(config)
        raise WouldStart(config)


@pytest.fixture(scope="module")
def no_workers():
    mp = pytest.MonkeyPatch()
    mp.setattr(workers, "Worker", NoWorker)
    mp.setattr(gang, "Gang", NoWorker)  # a mesh with a plain-PyTorch mode runs as a gang
    default = workers._POOL
    default_workers = dict(default.workers()) if default else None
    yield
    mp.undo()
    assert workers._POOL is default, "the default worker pool was created"
    if default is not None:
        assert default.workers() == default_workers


def _names_a_field(message: str, spec: wb.ExperimentSpec) -> bool:
    """The message names a field (as a word: "device" is not named by "num_devices") or one of
    the model options the spec sets."""
    names = [n for f in FIELDS for n in (f, *ALIASES.get(f, ()))]
    if isinstance(spec.options, dict):
        names += [k for k in spec.options if isinstance(k, str) and k]
    return any(re.search(rf"(?<!\w){re.escape(n)}(?!\w)", message, re.IGNORECASE)
               for n in names)


@settings(max_examples=500, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs())
@example(spec=wb.ExperimentSpec(capture="hlo"))
@example(spec=wb.ExperimentSpec(mesh=(3, 3), num_devices=9))
@example(spec=wb.ExperimentSpec(mesh=(0,)))
@example(spec=wb.ExperimentSpec(strategy="zero3", mesh=(8,)))
@example(spec=wb.ExperimentSpec(options={"n_layer": "2", "colour": 1}))
@example(spec=wb.ExperimentSpec(xla_flags="garbage"))
@example(spec=wb.ExperimentSpec(mode=["lazy"]))
def test_any_spec_validates_or_names_the_bad_field(no_workers, spec):
    pool = wb.WorkerPool(max_workers=1)
    NoWorker.started.clear()
    try:
        wb.submit(spec, pool=pool)
    except wb.SpecError as exc:
        event(str(exc).split(" ")[0])
        assert _names_a_field(str(exc), spec), f"{exc} (for {spec})"
        assert not NoWorker.started
    except WouldStart:  # valid: it crosses the process boundary as JSON and is still valid
        event("valid")
        assert len(NoWorker.started) == 1
        again = wb.ExperimentSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
        assert again.validate() == again and wb.runtime_config(again) == NoWorker.started[0]
        assert (spec.steps > 0 or spec.mesh) and math.isfinite(spec.lr or 1.0)
    else:
        pytest.fail(f"submit returned without starting a worker for {spec}")
    assert pool.workers() == {}


def test_capture_given_as_one_string_is_one_capture():
    spec = wb.ExperimentSpec(capture="hlo")
    assert spec.capture == ("hlo",) and spec.validate().to_dict()["capture"] == ["hlo"]
    assert wb.runtime_config(spec).dump_hlo
    assert wb.ExperimentSpec(xla_flags="--xla_a=1 --xla_b").xla_flags == ("--xla_a=1", "--xla_b")
    with pytest.raises(wb.SpecError, match="unknown capture 'flamegraph'"):
        wb.ExperimentSpec(capture="flamegraph").validate()
    with pytest.raises(wb.SpecError, match="capture='hlo' needs a mode that compiles HLO"):
        wb.ExperimentSpec(mode="torch_eager", capture="hlo").validate()


def test_uneven_mesh_batch_message_counts_the_data_axis_and_the_mesh():
    with pytest.raises(wb.SpecError, match=r"batch_size=32 does not divide over the data axis of "
                       r"mesh 3x3: strategy 'dp' splits the batch 3 ways \(the data axis: 3 of "
                       r"the mesh's 9 devices\); .*multiples of 3, e\.g\. 30 or 33"):
        wb.ExperimentSpec(mesh=(3, 3), num_devices=9).validate()
    with pytest.raises(wb.SpecError, match=r"splits the batch 9 ways \(the data x model axes: "
                       r"all 9 devices\)"):
        wb.ExperimentSpec(mesh=(3, 3), num_devices=9, strategy="fsdp").validate()


@pytest.mark.parametrize("changes, message", [
    ({"mode": ["lazy"]}, r"mode must be a string like 'compile', got \['lazy'\]"),
    ({"preset": None}, "preset must be a string"),
    ({"seed": True}, "seed must be an int"),
    ({"seed": 2**64}, "seed must be an int from"),
    ({"lr": float("inf")}, "lr must be a positive finite number"),
    ({"lr": True}, "lr must be a positive finite number"),
    ({"mesh": 8}, r"mesh must be a tuple of positive ints like \(2, 4\), or None, got 8"),
    ({"mesh": (True, 8)}, "mesh must be a tuple of positive ints"),
    ({"strategy": ["dp"], "mesh": (8,)}, "strategy must be None or one of dp"),
    ({"change": ["item"]}, "change must be None or one of"),
    ({"change_at": "2"}, "change_at must be an int"),
    ({"options": "n_layer=2"}, "options must be a dict"),
    ({"options": {1: 2}}, "options must be a dict .* string keys"),
    ({"options": {"n_layer": True}}, r"mingpt option n_layer must be an int .* got True"),
    ({"model": "mlp", "options": {"d_in": True}}, "mlp option d_in must be an int"),
    ({"capture": None}, "capture must be a tuple of strings"),
    ({"xla_flags": None}, "xla_flags must be a tuple of strings"),
    ({"persistent_cache": "no"}, "persistent_cache must be True or False"),
    ({"explain_compiles": "yes"}, "explain_compiles must be True, False or None"),
])
def test_wrong_types_are_named(changes, message):
    with pytest.raises(wb.SpecError, match=message):
        wb.ExperimentSpec().replace(**changes).validate()
