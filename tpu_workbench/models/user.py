"""Your own model: ``model="path/to/file.py:make"`` or ``model="package.module:make"``.

The part after the last ``:`` names a callable in the file or module; the workbench calls it with
no arguments and it returns one of two things:

- a :class:`~tpu_workbench.models.base.ModelFamily` instance (``make`` may be the class itself):
  used as it is, with its own presets, options and FLOP count;
- a *factory*: any object (a class instance, a ``SimpleNamespace``, a module, a ``dict``) with

  ============================================  ==============================================
  ``build()``                                   a randomly initialised ``nn.Module`` (torch is
                                                seeded first, and sharding calls it under
                                                ``torch.device("meta")``)
  ``make_batch(batch_size, generator)``         one batch, a ``dict`` of CPU tensors,
                                                deterministic given the ``torch.Generator``
  ``loss(model, batch)``                        the scalar training loss
  ``evaluate(model, batch)`` (optional)         a scalar metric tensor; without it the
                                                evaluation reports the loss
  ``metric_name`` (optional)                    what ``evaluate`` returns (default
                                                ``"metric"``, or ``"loss"`` without evaluate)
  ``batch_size`` (optional, default 8)          the batch when the spec sets none
  ``lr`` (optional, default 1e-3)               the learning rate when the spec sets none
  ``flops_per_step(batch_size)`` (optional)     analytic FLOPs of one training step; without it
                                                the figure (and MFU) is NaN: unknown
  ``items_per_batch(batch_size)`` (optional)    items one batch holds (default: batch_size)
  ``item_unit`` (optional, default "samples")   what an item is, for throughput
  ``sequence_dim`` (optional)                   the batch's sequence axis (``change="seq_len"``)
  ``name`` (optional)                           the family's name in messages (default: the
                                                file's or module's name)
  ============================================  ==============================================

  wrapped into a family with the one preset ``"default"``: a factory has no size presets and no
  options, so ``ExperimentSpec(model="my_model.py:make", preset="default")``; any other preset or
  any ``options`` is a SpecError naming what is valid. Sizes are the factory's to choose: write
  one ``make`` per size (``make_small``, ``make_big``) and name it in the ref.

Where the code is found. A path is relative to the current directory of the process that loads it:
the notebook's kernel (``marimo edit`` keeps the directory it was started in: the repository root
in the README) and its worker processes, which inherit it. The file is imported as a module of
its own, not as part of a package, so it cannot import the files beside it unless their folder
is on ``sys.path``; a module ref is imported from ``sys.path``, and a worker's ``sys.path`` is its
current directory, ``PYTHONPATH`` and the installed packages (not the notebook's folder that
marimo adds to the kernel's), so a module beside a notebook is best named by its path.

The file is imported in the process that validates the spec (the notebook's kernel) as well as
in the worker (the kernel also calls ``build`` on the meta device to plan a layout), so keep it
free of ``torch_xla``: only a worker may import it, as it claims the TPU.

A file's sources are the file and the local modules it imports (:func:`local_sources`: the files
of its own folder or package its import statements reach, read statically). A file is imported
under a name made from its absolute path (``tpu_workbench_user_<hash>``) and imported again only
when its sources' content changes (the changed local modules with it), so an edit is picked up
by the next run (also in a warm worker) and unchanged code is not executed again; a module ref
is imported afresh when its sources change. :func:`source_digest` is their content hash, which a
run's identity includes (:func:`tpu_workbench.runs.store.fingerprint`): editing the file or a
module beside it that it imports measures again. Imports by name in a string
(``importlib.import_module("helper")``) are not seen.

Every failure is a :class:`SpecError` naming the ref, the file and what was expected; an exception
raised while importing the file or calling ``make`` carries the user's traceback in its message,
so a notebook shows it and its kernel stays alive.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import math
import sys
import traceback
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SpecError

if TYPE_CHECKING:
    from .base import ModelFamily

REQUIRED = ("build", "make_batch", "loss")
PRESET = "default"
_MODULE_PREFIX = "tpu_workbench_user_"
# absolute file -> (content hash, module); module name -> content hash when last (re)loaded
_FILES: dict[str, tuple[str, types.ModuleType]] = {}
_MODULES: dict[str, str] = {}


def is_user_ref(name: str) -> bool:
    """Whether a model name is a user's ref (``file.py:make``, ``pkg.mod:make``), not a family
    of the workbench's or a Hugging Face one (``hf:llama``)."""
    return isinstance(name, str) and ":" in name and not name.startswith("hf:")


def load_family(ref: str) -> ModelFamily:
    """The model family `ref` makes (``"path/to/file.py:make"`` or ``"package.module:make"``).

    Raises SpecError naming the file or module, the attribute and what was expected.
    """
    where, attr = _split(ref)
    if _is_path(where):
        path = _resolve(where)
        module = _load_file(ref, path)
        origin = str(path)
    else:
        module = _load_module(ref, where)
        origin = getattr(module, "__file__", None) or where
    if not hasattr(module, attr):
        public = sorted(n for n, v in vars(module).items()
                        if callable(v) and not n.startswith("_")
                        and getattr(v, "__module__", None) == module.__name__)
        raise SpecError(f"model {ref!r}: {origin} has no attribute {attr!r}; expected a function "
                        f"{attr}() returning a ModelFamily or a factory (build, make_batch, loss)"
                        + (f"; its own callables: {', '.join(public)}" if public else ""))
    make = getattr(module, attr)
    if not callable(make):
        raise SpecError(f"model {ref!r}: {attr} in {origin} is not callable (it is "
                        f"{_short(make)}, of type {type(make).__name__}); expected a function "
                        f"{attr}() returning a ModelFamily or a factory (build, make_batch, loss)")
    try:
        made = make()
    except Exception as exc:
        raise SpecError(f"model {ref!r}: calling {attr}() in {origin} raised "
                        f"{type(exc).__name__}: {exc}\n\n{_user_traceback(exc, origin)}") from exc
    return _family(ref, origin, attr, made, _default_name(where))


def source_file(ref: str) -> Path | None:
    """The file whose content makes `ref`'s family (without importing it), or None when it
    cannot be found (then :func:`load_family` raises the error that says why)."""
    try:
        where, _ = _split(ref)
    except SpecError:
        return None
    if _is_path(where):
        path = _resolve(where)
        return path if path.is_file() else None
    try:
        spec = importlib.util.find_spec(where)  # imports the parent package, not the module
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return None
    return Path(spec.origin).resolve()


def source_digest(ref: str) -> dict[str, Any] | None:
    """``{"file", "sha256", "imports"}`` of the file behind a user's ref: sha256 over its content
    and that of the local modules it imports (:func:`local_sources`, listed in ``imports``);
    sha256 ``"missing"`` when the file cannot be found; None for a name that is not a user's
    ref."""
    if not is_user_ref(ref):
        return None
    path = source_file(ref)
    if path is None:
        return {"file": "", "sha256": "missing", "imports": []}
    sources = local_sources(path)
    return {"file": str(path), "sha256": _sources_digest(sources),
            "imports": [str(p) for p in sources[1:]]}


def local_sources(path: Path) -> list[Path]:
    """`path`, then the files of its own folder (its package, where it is in one: every folder up
    to the last with an ``__init__.py``) that it imports, directly or through one another, and
    the ``__init__.py`` of each package on the way. Found by reading their ``import x``, ``from
    x import y`` (``y`` may be a module) and relative imports with :mod:`ast`: nothing is
    imported, and an import cycle is followed once."""
    path = path.resolve()
    scope = path.parent
    while (scope / "__init__.py").is_file() and (scope.parent / "__init__.py").is_file():
        scope = scope.parent
    if scope.name in ("site-packages", "dist-packages"):  # an installed top-level module: the
        return [path]  # modules beside it are other distributions, not its own
    # absolute imports resolve against the folder holding the top package (or the file's folder)
    base = scope.parent if (scope / "__init__.py").is_file() else scope
    found = {path}
    todo = [path]
    while todo:
        for target in _imported_files(todo.pop(), base):
            if target not in found and target.is_relative_to(scope):
                found.add(target)
                todo.append(target)
    return [path, *sorted(found - {path})]


def _imported_files(path: Path, base: Path) -> list[Path]:
    """The files under `base` that `path`'s import statements (anywhere in it) may run."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (SyntaxError, ValueError, OSError):  # loading it says what is wrong
        return []
    out = [p / "__init__.py" for p in path.parents if p.is_relative_to(base) and p != base]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out += _module_files(base, alias.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            if node.level > len(path.parents):  # above the file system's root: no file
                continue
            start = base if not node.level else path.parents[node.level - 1]
            parts = node.module.split(".") if node.module else []
            out += _module_files(start, parts)
            for alias in node.names:  # `from pkg import mod` imports a module too
                if alias.name != "*":
                    out += _module_files(start, [*parts, alias.name])
    return [p.resolve() for p in out if p.is_file()]


def _module_files(start: Path, parts: list[str]) -> list[Path]:
    """What importing the dotted `parts` from folder `start` runs: each package's
    ``__init__.py`` on the way, then the module's file (existing ones only)."""
    out = [start.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts) + 1)]
    if parts:
        out.append(start.joinpath(*parts).with_suffix(".py"))
    return [p for p in out if p.is_file()]


def _sources_digest(sources: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in sources:
        digest.update(str(path).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _forget(sources: list[Path]) -> None:
    """Drop the modules loaded from `sources` (and their parents' attributes naming them), so
    the next import runs the files as they are now."""
    files = {str(p) for p in sources}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and str(Path(file).resolve()) in files:
            del sys.modules[name]
            parent, _, child = name.rpartition(".")
            if parent and getattr(sys.modules.get(parent), child, None) is module:
                delattr(sys.modules[parent], child)


# -- finding and importing the code ---------------------------------------------------------
def _split(ref: str) -> tuple[str, str]:
    where, sep, attr = ref.rpartition(":")
    if not sep or not where or not attr.isidentifier():
        raise SpecError(f"model {ref!r} is not a ref to your own model; expected "
                        "'path/to/file.py:make' or 'package.module:make' (a Python name after "
                        "the last ':')")
    return where, attr


def _is_path(where: str) -> bool:
    return where.endswith(".py") or "/" in where or where.startswith(".")


def _resolve(where: str) -> Path:
    return Path(where).expanduser().resolve()  # relative: against the current directory


def _load_file(ref: str, path: Path) -> types.ModuleType:
    if not path.is_file():
        why = "is a folder" if path.is_dir() else "does not exist"
        raise SpecError(f"model {ref!r}: the file {path} {why} (a relative path is taken from "
                        f"the current directory, {Path.cwd()}); expected a Python file that "
                        "defines the function named after the ':'")
    if path.suffix != ".py":
        raise SpecError(f"model {ref!r}: {path} is not a .py file")
    source = path.read_bytes()
    sources = local_sources(path)
    digest = _sources_digest(sources)
    key = str(path)
    cached = _FILES.get(key)
    if cached is not None and cached[0] == digest:
        return cached[1]
    if cached is not None:  # the file or a module it imports changed: run them as they are now
        _forget(sources[1:])
    name = _MODULE_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py file always has a loader
    module = importlib.util.module_from_spec(spec)
    previous = sys.modules.get(name)
    sys.modules[name] = module  # dataclasses, pickling and dynamo look the module up by name
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)  # the bytes just hashed
    except BaseException as exc:
        if previous is not None:
            sys.modules[name] = previous
        else:
            sys.modules.pop(name, None)
        if not isinstance(exc, Exception):
            raise
        raise SpecError(f"model {ref!r}: importing {path} raised {type(exc).__name__}: {exc}"
                        f"\n\n{_user_traceback(exc, str(path))}") from exc
    _FILES[key] = (digest, module)
    return module


def _load_module(ref: str, name: str) -> types.ModuleType:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise SpecError(f"model {ref!r}: no module named {name!r} on sys.path (current "
                            f"directory {Path.cwd()}); expected an importable module, or a "
                            "path to a file such as 'path/to/file.py:make'") from exc
        raise _import_error(ref, name, exc) from exc
    except Exception as exc:
        raise _import_error(ref, name, exc) from exc
    file = getattr(module, "__file__", None)
    if file and Path(file).is_file():
        sources = local_sources(Path(file))
        digest = _sources_digest(sources)
        if _MODULES.setdefault(name, digest) != digest:  # it or its imports edited since
            _forget(sources)  # its packages too: a fresh import, where reload keeps old parts
            try:
                module = importlib.import_module(name)
            except Exception as exc:
                raise _import_error(ref, name, exc) from exc
            _MODULES[name] = digest
    return module


def _import_error(ref: str, name: str, exc: Exception) -> SpecError:
    try:
        spec = importlib.util.find_spec(name)
    except Exception:  # the parent package itself fails to import
        spec = None
    origin = (spec.origin if spec is not None else None) or name
    return SpecError(f"model {ref!r}: importing {origin} raised {type(exc).__name__}: {exc}"
                     f"\n\n{_user_traceback(exc, origin)}")


def _user_traceback(exc: BaseException, origin: str) -> str:
    """The traceback from the first frame in the user's file on (the loader's frames cut)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != origin:
        tb = tb.tb_next
    if tb is None:  # a SyntaxError (no frame of the file ran), or raised outside it
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
    if tb is None:
        return "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
    return "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()


def _default_name(where: str) -> str:
    return Path(where).stem if _is_path(where) else where.rsplit(".", 1)[-1]


# -- the family ------------------------------------------------------------------------------
def _family(ref: str, origin: str, attr: str, made: Any, name: str) -> ModelFamily:
    from .base import ModelFamily

    if isinstance(made, ModelFamily):
        presets = getattr(made, "presets", None)
        if not isinstance(presets, dict) or not presets:
            raise SpecError(f"model {ref!r}: {attr}() in {origin} returned a ModelFamily "
                            f"({type(made).__name__}) without presets; expected a dict "
                            "preset name -> config dataclass instance")
        if not isinstance(getattr(made, "name", None), str):
            made.name = name
        return made
    missing = [m for m in REQUIRED if not callable(_get(made, m))]
    if missing:
        raise SpecError(f"model {ref!r}: {attr}() in {origin} returned "
                        f"{_short(made)} ({type(made).__name__}); expected a ModelFamily, or a "
                        "factory with build(), make_batch(batch_size, generator) and "
                        f"loss(model, batch); missing: {', '.join(missing)}")
    return _factory_class()(made, _get(made, "name") or name)


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclasses.dataclass(frozen=True)
class FactoryConfig:
    """The one config of a factory's family: the batch it uses when the spec sets none."""

    batch_size: int = 8


@functools.cache
def _factory_class() -> type:
    from .base import ModelFamily

    class FactoryFamily(ModelFamily):
        """A :class:`ModelFamily` around a user's factory (see the module docstring)."""

        def __init__(self, factory: Any, name: str):
            self.factory = factory
            self.name = str(name)
            batch = _get(factory, "batch_size")
            self.presets = {PRESET: FactoryConfig(8 if batch is None else batch)}
            self.default_lr = float(_get(factory, "lr") or 1e-3)
            self.item_unit = str(_get(factory, "item_unit") or "samples")
            self.sequence_dim = _get(factory, "sequence_dim")
            has_eval = callable(_get(factory, "evaluate"))
            self.metric_name = str(_get(factory, "metric_name")
                                   or ("metric" if has_eval else "loss"))

        def config(self, preset: str, **overrides: Any) -> FactoryConfig:
            if preset != PRESET:
                raise SpecError(f"unknown preset {preset!r} for model {self.name!r}: a factory "
                                f"has the one preset {PRESET!r}; valid presets: {PRESET}")
            if overrides:
                raise SpecError(f"model {self.name!r} is a factory, which takes no options; got "
                                f"{sorted(overrides)} (write one make function per variant)")
            cfg = self.presets[PRESET]
            self.check_config(cfg)
            return cfg

        def check_config(self, cfg: FactoryConfig) -> None:
            b = cfg.batch_size
            if not isinstance(b, int) or isinstance(b, bool) or b <= 0:
                raise SpecError(f"model {self.name!r}: the factory's batch_size must be a "
                                f"positive int, got {b!r}")

        def build(self, cfg: FactoryConfig) -> Any:
            return _get(self.factory, "build")()

        def make_batch(self, cfg: FactoryConfig, batch_size: int, generator: Any) -> Any:
            return _get(self.factory, "make_batch")(batch_size, generator)

        def loss(self, model: Any, batch: Any) -> Any:
            return _get(self.factory, "loss")(model, batch)

        def evaluate(self, model: Any, batch: Any) -> Any:
            fn = _get(self.factory, "evaluate")
            return fn(model, batch) if callable(fn) else self.loss(model, batch)

        def items_per_batch(self, cfg: FactoryConfig, batch_size: int) -> int:
            fn = _get(self.factory, "items_per_batch")
            return int(fn(batch_size)) if callable(fn) else batch_size

        def flops_per_step(self, cfg: FactoryConfig, batch_size: int) -> float:
            fn = _get(self.factory, "flops_per_step")
            return float(fn(batch_size)) if callable(fn) else math.nan

    FactoryFamily.__qualname__ = "FactoryFamily"
    return FactoryFamily


def __getattr__(name: str) -> Any:
    # FactoryFamily subclasses ModelFamily, whose module imports torch: made on first use, so
    # importing this module (the store does, to hash a user's file) stays free of torch.
    if name == "FactoryFamily":
        return _factory_class()
    raise AttributeError(name)
