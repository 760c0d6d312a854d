"""Your own model: ``model="tests/models/tiny_mlp.py:make"`` (or ``package.module:make``).

Loading (a factory, a ModelFamily, a module ref), the error for each bad input, a run through the
runner in plain PyTorch and in torch_xla lazy mode, and the run's identity following the file.
The expected figures come from the model file's shapes by hand (parameters, FLOPs) and from plain
PyTorch (XLA's losses), not from the code under test.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest

import tpu_workbench as wb
from tpu_workbench.errors import SpecError
from tpu_workbench.models.user import load_family, source_digest

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "models"
TINY = "tests/models/tiny_mlp.py:make"

# A user file small enough to write inline; VERSION shows which content was imported.
VERSIONED = """
from types import SimpleNamespace

import torch
import torch.nn.functional as F

VERSION = {version}


def make():
    return SimpleNamespace(
        build=lambda: torch.nn.Linear(4, 2),
        make_batch=lambda n, g: {{"x": torch.randn(n, 4, generator=g),
                                  "y": torch.zeros(n, dtype=torch.long)}},
        loss=lambda model, batch: F.cross_entropy(model(batch["x"]), batch["y"]),
        name=f"v{{VERSION}}")
"""


@pytest.fixture
def at_root(monkeypatch):
    """Relative refs are taken from the current directory: the repository root here."""
    monkeypatch.chdir(ROOT)


# -- loading ---------------------------------------------------------------------------------
def test_a_factory_file_becomes_a_family_with_the_one_preset_default(at_root):
    import torch

    family = load_family(TINY)
    assert family.name == "tiny_mlp" and list(family.presets) == ["default"]
    cfg = family.config("default")
    assert family.default_batch_size(cfg) == 64 and family.default_lr == 1e-2
    assert family.metric_name == "accuracy" and family.item_unit == "samples"
    # 3 x (2 x batch x MACs of Linear(16, 32) and Linear(32, 4)), by hand: 6 * 64 * 640
    assert family.flops_per_step(cfg, 64) == 245_760
    model = family.build(cfg)
    assert sum(p.numel() for p in model.parameters()) == 16 * 32 + 32 + 32 * 4 + 4
    one, two = (family.make_batch(cfg, 8, torch.Generator().manual_seed(3)) for _ in range(2))
    assert torch.equal(one["x"], two["x"]) and one["y"].shape == (8,)
    assert family.loss(model, one).ndim == 0 and 0 <= float(family.evaluate(model, one)) <= 1
    with pytest.raises(SpecError, match=r"unknown preset 'tiny'.*valid presets: default"):
        family.config("tiny")
    with pytest.raises(SpecError, match=r"takes no options; got \['width'\]"):
        family.config("default", width=3)


def test_a_model_family_file_is_used_as_it_is(at_root):
    family = load_family("tests/models/tiny_family.py:make")  # make is the class itself
    assert type(family).__name__ == "TinyFamily" and list(family.presets) == ["small", "wide"]
    assert family.config("wide", width=3).width == 3
    with pytest.raises(SpecError, match="valid presets: small, wide"):
        family.config("default")


def test_an_absolute_path_loads_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_family(f"{MODELS / 'tiny_mlp.py'}:make").name == "tiny_mlp"


def test_a_file_is_imported_again_only_when_its_content_changes(tmp_path):
    path = tmp_path / "versioned.py"
    path.write_text(VERSIONED.format(version=1))
    ref = f"{path}:make"
    first, again = load_family(ref), load_family(ref)
    assert first.name == again.name == "v1"
    assert first.factory.build.__globals__ is again.factory.build.__globals__  # not re-run
    path.write_text(VERSIONED.format(version=2))  # same second, same size: the content decides
    assert load_family(ref).name == "v2"


def test_a_module_ref_loads_and_reloads_when_its_file_changes(tmp_path, monkeypatch):
    package = f"wb_user_models_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "model.py").write_text(VERSIONED.format(version=1))
    monkeypatch.syspath_prepend(str(tmp_path))
    ref = f"{package}.model:make"
    assert load_family(ref).name == "v1"
    digest = source_digest(ref)
    assert digest["file"] == str(tmp_path / package / "model.py")
    (tmp_path / package / "model.py").write_text(VERSIONED.format(version=2))
    assert load_family(ref).name == "v2" and source_digest(ref)["sha256"] != digest["sha256"]


# -- bad input -------------------------------------------------------------------------------
BAD = {
    "tests/models/missing.py:make": ["tests/models/missing.py does not exist",
                                     f"current directory, {ROOT}"],
    "tests/models/no_make.py:make": ["no_make.py has no attribute 'make'", "expected a function",
                                     "its own callables: build_model"],
    "tests/models/bad_return.py:make": ["make() in", "bad_return.py returned Linear(",
                                        "expected a ModelFamily, or a factory",
                                        "missing: build, make_batch, loss"],
    "tests/models/bad_return.py:make_half": ["(dict)", "missing: make_batch, loss"],
    "tests/models/bad_return.py:not_callable": ["not_callable in", "is not callable (it is 42"],
    "tests/models/bad_import.py:make": [
        "importing", "bad_import.py raised RuntimeError: settings.toml not found",
        "Traceback (most recent call last)", 'bad_import.py", line 10, in <module>',
        "in _load_settings"],
    "wb_no_such_module:make": ["no module named 'wb_no_such_module' on sys.path",
                               "'path/to/file.py:make'"],
    "tests/models/tiny_mlp.py:": ["is not a ref to your own model"],
    "tests/models/tiny_mlp.py:2make": ["a Python name after the last ':'"],
}


@pytest.mark.parametrize("ref", list(BAD))
def test_each_bad_ref_names_the_file_the_attribute_and_what_was_expected(ref, at_root):
    with pytest.raises(SpecError) as info:
        load_family(ref)
    text = str(info.value)
    assert text.startswith(f"model {ref!r}")
    for fragment in BAD[ref]:
        assert fragment in text, (fragment, text)


def test_the_loaders_own_frames_are_cut_from_the_traceback(at_root):
    with pytest.raises(SpecError) as info:
        load_family("tests/models/bad_import.py:make")
    assert "user.py" not in str(info.value) and "importlib" not in str(info.value)


def test_a_syntax_error_and_a_failing_make_show_where(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def make():\n    return (\n")
    with pytest.raises(SpecError, match=r"(?s)SyntaxError.*broken\.py.*line 2"):
        load_family(f"{broken}:make")
    failing = tmp_path / "failing.py"
    failing.write_text("def make():\n    return {}['build']\n")
    with pytest.raises(SpecError, match=r"(?s)calling make\(\).*KeyError.*failing\.py\", line 2"):
        load_family(f"{failing}:make")


# -- identity: a stored run follows the file's content ---------------------------------------
def _store_run(root: Path, spec: wb.ExperimentSpec, fp: dict) -> None:
    """A completed run folder as the runner writes one (what reuse reads)."""
    folder = root / f"20260101-000000-user-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True)
    (folder / "environment.json").write_text(json.dumps(
        {"task": "train", "measured_at": "2026-01-01 00:00:00", "fingerprint": fp,
         "runtime": {}, "wall_s": 1.0, "worker_start_s": 1.0}))
    (folder / "spec.json").write_text(json.dumps(spec.to_dict()))
    (folder / "summary.json").write_text("{}")
    (folder / "records.jsonl").write_text("")


def test_editing_the_model_file_makes_a_stored_run_not_reusable(tmp_path):
    path = tmp_path / "mine.py"
    shutil.copy(MODELS / "tiny_mlp.py", path)
    spec = wb.ExperimentSpec(model=f"{path}:make", preset="default", mode="torch_eager",
                             steps=3)
    config = wb.runtime_config(spec)
    fp = wb.fingerprint(config, spec)
    assert fp["model_source"]["file"] == str(path)
    assert "model_source" not in wb.fingerprint(config, spec.replace(model="mlp"))
    _store_run(tmp_path / "results", spec, fp)
    assert wb.reusable(spec, out_dir=tmp_path / "results") is not None
    path.write_text(path.read_text() + "\n# an edit\n")
    assert wb.fingerprint(config, spec)["model_source"]["sha256"] != fp["model_source"]["sha256"]
    assert wb.reusable(spec, out_dir=tmp_path / "results") is None


# A user file that takes its width from a module beside it, imported as a top-level module (its
# folder on sys.path), and the helper it reads.
WITH_HELPER = """
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import {helper}


def make():
    return SimpleNamespace(
        build=lambda: torch.nn.Linear(4, {helper}.WIDTH),
        make_batch=lambda n, g: {{"x": torch.randn(n, 4, generator=g),
                                  "y": torch.zeros(n, dtype=torch.long)}},
        loss=lambda model, batch: F.cross_entropy(model(batch["x"]), batch["y"]),
        name=f"width{{{helper}.WIDTH}}")
"""


def test_editing_a_module_the_model_file_imports_measures_again(tmp_path, monkeypatch):
    """mine.py imports a helper beside it: editing the helper changes the fingerprint's
    model_source (a stored run is not reused) and is what the next load runs; editing another
    file of the folder changes neither."""
    helper = f"wb_helper_{uuid.uuid4().hex[:8]}"  # a name no other test's sys.modules holds
    (tmp_path / f"{helper}.py").write_text("WIDTH = 2\n")
    (tmp_path / "unrelated.py").write_text("X = 1\n")
    path = tmp_path / "mine.py"
    path.write_text(WITH_HELPER.format(helper=helper))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = wb.ExperimentSpec(model=f"{path}:make", preset="default", mode="torch_eager",
                             steps=2)
    config = wb.runtime_config(spec)
    fp = wb.fingerprint(config, spec)
    assert load_family(spec.model).name == "width2"
    _store_run(tmp_path / "results", spec, fp)

    (tmp_path / "unrelated.py").write_text("X = 2\n")
    assert wb.fingerprint(config, spec) == fp
    # another size too: Python checks a .pyc by the source's size and mtime in whole seconds
    (tmp_path / f"{helper}.py").write_text("WIDTH = 16\n")
    assert wb.fingerprint(config, spec)["model_source"]["sha256"] != fp["model_source"]["sha256"]
    assert wb.reusable(spec, out_dir=tmp_path / "results") is None
    assert load_family(spec.model).name == "width16"  # this process imported width 2 before


def test_a_packages_relative_imports_are_followed_statically_cycles_and_all(tmp_path):
    """A model inside a package: ``from . import``, ``from .sub.deep import``, ``import pkg.x``
    and an import cycle are followed to files of the package, without importing any of them
    (each raises if run); a file nothing imports, and one outside the package, are not."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    boom = "raise RuntimeError('imported')\n"
    files = {
        "pkg/__init__.py": "",
        "pkg/model.py": "import os\nfrom . import layers\n" + boom,
        "pkg/layers.py": "from .model import make\nfrom .sub.deep import g\n" + boom,
        "pkg/sub/__init__.py": "",
        "pkg/sub/deep.py": "import pkg.util\n" + boom,
        "pkg/util.py": boom,
        "pkg/other.py": boom,
        "outside.py": boom,
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    ref = f"{package / 'model.py'}:make"
    before = source_digest(ref)
    assert before["file"] == str(package / "model.py")
    for name, hashed in (("pkg/other.py", False), ("outside.py", False),
                         ("pkg/util.py", True), ("pkg/sub/deep.py", True),
                         ("pkg/sub/__init__.py", True), ("pkg/layers.py", True)):
        (tmp_path / name).write_text(files[name] + "# an edit\n")
        after = source_digest(ref)
        assert (after["sha256"] != before["sha256"]) is hashed, name
        before = after


# -- through the spec and the runner (models.get_model hands refs to load_family) -----------
def test_the_spec_validates_a_user_ref_and_shows_the_users_traceback(at_root):
    spec = wb.ExperimentSpec(model=TINY, preset="default", mode="torch_eager", steps=3)
    assert spec.validate() is spec
    with pytest.raises(SpecError, match="valid presets: default"):
        spec.replace(preset="tiny").validate()
    with pytest.raises(SpecError, match=r"(?s)RuntimeError: settings.toml.*line 10"):
        spec.replace(model="tests/models/bad_import.py:make").validate()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.chdir(ROOT)  # the workers inherit it: the relative ref resolves the same there
    mp.setenv("TPU_WORKBENCH_RESULTS", str(tmp_path_factory.mktemp("results")))
    pool = wb.WorkerPool()
    try:
        yield pool, {mode: wb.run(wb.ExperimentSpec(model=TINY, preset="default", mode=mode,
                                                    steps=3), pool=pool)
                     for mode in ("torch_eager", "lazy")}
    finally:
        pool.shutdown()
        mp.undo()


def test_a_user_model_trains_in_plain_pytorch_and_on_xla_with_the_same_losses(runs):
    _, results = runs
    cpu = results["torch_eager"].steps["loss"].to_numpy()
    xla = results["lazy"].steps["loss"].to_numpy()
    assert len(cpu) == len(xla) == 3 and cpu[-1] < cpu[0], cpu
    np.testing.assert_allclose(xla[0], cpu[0], rtol=1e-4)
    np.testing.assert_allclose(xla, cpu, rtol=5e-3)
    summary = results["lazy"].summary
    assert summary["n_params"] == 16 * 32 + 32 + 32 * 4 + 4 and summary["batch_size"] == 64
    assert summary["flops_per_step"] == 245_760 and summary["metric_name"] == "accuracy"
    assert results["lazy"].fingerprint["model_source"] == source_digest(TINY)


def test_a_user_run_is_reused_until_its_file_changes(runs, tmp_path):
    pool, _ = runs
    path = tmp_path / "mine.py"
    shutil.copy(MODELS / "tiny_mlp.py", path)
    spec = wb.ExperimentSpec(model=f"{path}:make", preset="default", mode="torch_eager",
                             steps=2)
    out = tmp_path / "results"
    first = wb.run(spec, pool=pool, out_dir=out)
    assert wb.run(spec, reuse=True, pool=pool, out_dir=out).run_id == first.run_id
    path.write_text(path.read_text() + "\n# an edit\n")
    again = wb.run(spec, reuse=True, pool=pool, out_dir=out)
    assert not again.reused and again.run_id != first.run_id
