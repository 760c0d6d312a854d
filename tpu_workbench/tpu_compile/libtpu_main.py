"""Compile one traced HLO module for a named TPU slice with libtpu's compile-only client.

Run as a script by :mod:`tpu_workbench.tpu_compile.compile`, in a process of its own under
``.venv-libtpu``'s interpreter (jax + libtpu; no torch, no torch_xla, no workbench imports):

    .venv-libtpu/bin/python libtpu_main.py REQUEST.json

REQUEST: ``proto`` (the HLO module proto torch_xla traced), ``topology`` (``"v6e:2x4"``),
``host_bounds`` (chips per host, or null for libtpu's default), ``out`` (a folder),
``retarget_from`` (the device count the proto was traced on, when that is fewer than the
slice's chips: every sharding annotation is rewritten from it to the slice's; 1-D meshes only),
``aliases`` (``[[output, parameter], ...]``: outputs that update an input in place).

Nothing is allocated or run: the client has no chip. Writes to ``out``: ``compiled.json``
(versions, device kind, chips, compile time, the compiler's memory stats and cost analysis),
``tpu_hlo.txt`` (the optimised, partitioned program of chip 0, as the compiler dumped it) and
``dump/`` (the compiler's memory-usage report of it). On a compile error, ``error.txt`` and exit 3.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path


def retarget(text: str, n_from: int, n_to: int) -> tuple[str, int]:
    """Rewrite every ``mhlo.sharding`` of StableHLO `text` from a 1-D mesh of `n_from` devices
    to one of `n_to`: the tile dimension of `n_from` becomes `n_to`, device lists cover
    ``0..n_to-1``. Returns the text and how many annotations changed."""

    def fix(match: re.Match) -> str:
        s = match.group(0)
        s = re.sub(r"devices=\[([\d,]+)\]", lambda m: "devices=[" + ",".join(
            str(n_to) if int(d) == n_from else d for d in m.group(1).split(",")) + "]", s)
        s = s.replace(f"<=[{n_from}]", f"<=[{n_to}]")
        return re.sub(r"\](\d+(?:,\d+)+)", lambda m: "]" + ",".join(map(str, range(n_to)))
                      if len(m.group(1).split(",")) == n_from else m.group(0), s)

    return re.subn(r'mhlo\.sharding = "[^"]*"', fix, text)


def entry_attributes(module, aliases: list[list[int]]) -> None:
    """Give `module`'s main function the entry a torch_xla program has on a chip: default
    (row-major) layouts for every argument and result, as the runtime hands buffers over, and
    each ``[output, parameter]`` pair of `aliases` one buffer (``tf.aliasing_output``, as jax
    donates): an in-place update. (Left to choose, the compiler gives a weight the layout of
    its first use, and an aliased pair of different layouts does not compile.)"""
    from jax._src.lib.mlir import ir

    main = next(op for op in module.body.operations
                if ir.StringAttr(op.attributes["sym_name"]).value == "main")
    i32 = ir.IntegerType.get_signless(32)
    kind = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)

    def updated(attrs: list, types: list, extra: dict[int, dict]) -> ir.ArrayAttr:
        out = []
        for i, (attr, type_) in enumerate(zip(attrs, types, strict=True)):
            entries = {a.name: a.attr for a in ir.DictAttr(attr)}
            rank = ir.RankedTensorType(type_).rank  # torch_xla's are all ranked tensors
            # row-major: "{1,0}" for a matrix
            entries["mhlo.layout_mode"] = ir.StringAttr.get(
                "{" + ",".join(map(str, reversed(range(rank)))) + "}")
            entries.update(extra.get(i, {}))
            out.append(ir.DictAttr.get(entries))
        return ir.ArrayAttr.get(out)

    def attrs_of(key: str, n: int) -> list:
        return list(ir.ArrayAttr(main.attributes[key])) if key in main.attributes \
            else [ir.DictAttr.get({})] * n

    donated = {parameter: {"tf.aliasing_output": ir.IntegerAttr.get(i32, output)}
               for output, parameter in aliases}
    main.attributes["arg_attrs"] = updated(attrs_of("arg_attrs", len(kind.inputs)),
                                           list(kind.inputs), donated)
    main.attributes["res_attrs"] = updated(attrs_of("res_attrs", len(kind.results)),
                                           list(kind.results), {})


def main(request_path: str) -> int:
    request = json.loads(Path(request_path).read_text())
    out = Path(request["out"])
    out.mkdir(parents=True, exist_ok=True)
    import numpy as np
    from jax._src import compiler
    from jax._src.interpreters import mlir as jmlir
    from jax._src.lib import _jax
    from jax._src.lib import xla_client as xc
    from jax._src.lib.mlir import ir
    from jax.experimental import topologies

    started = time.perf_counter()
    kwargs = {"chips_per_host_bounds": request["host_bounds"]} if request.get("host_bounds") \
        else {}
    devices = topologies.get_topology_desc(topology_name=request["topology"], platform="tpu",
                                           **kwargs).devices
    with jmlir.make_ir_context():
        module = ir.Module.parse(_jax.mlir.hlo_to_stablehlo(
            Path(request["proto"]).read_bytes()))
        rewritten = 0
        if request.get("retarget_from"):
            text, rewritten = retarget(str(module), int(request["retarget_from"]), len(devices))
            module = ir.Module.parse(text)
        entry_attributes(module, request.get("aliases") or [])
        options = compiler.get_compile_options(
            num_replicas=1, num_partitions=len(devices),
            device_assignment=np.array(devices).reshape(1, -1))
        build = options.executable_build_options
        build.use_spmd_partitioning = True
        # GSPMD reads the mhlo.sharding annotations torch_xla wrote; Shardy would ignore them.
        build.use_shardy_partitioner = False
        # Outputs take the sharding the program gives them (the updated weights and moments:
        # their inputs'), so an in-place update is one buffer per chip, as on a chip.
        build.allow_spmd_sharding_propagation_to_output = [True]
        build.debug_options.xla_dump_to = str(out / "dump")
        build.debug_options.xla_dump_hlo_as_text = True
        compile_started = time.perf_counter()
        try:
            exe = devices[0].client.compile(
                module, executable_devices=xc.DeviceList(tuple(devices)),
                compile_options=options)
        except Exception as exc:  # noqa: BLE001 - libtpu raises XlaRuntimeError and others
            (out / "error.txt").write_text(f"{type(exc).__name__}: {exc}")
            return 3
    compile_s = time.perf_counter() - compile_started
    stats = exe.get_compiled_memory_stats()
    memory = {k: int(getattr(stats, k)) for k in dir(stats)
              if k.endswith("_in_bytes") and not k.startswith("_")}
    cost = exe.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    # The compiler's own text of the program (exe.hlo_modules()[0] can be a small module it
    # extracted, and printing can fail on async ops): the largest after-optimisations dump.
    dumped = max((out / "dump").glob("*after_optimizations.txt"), key=lambda p: p.stat().st_size)
    prefix = dumped.name.removesuffix("after_optimizations.txt")
    dumped.replace(out / "tpu_hlo.txt")
    for path in (out / "dump").iterdir():  # keep the program's memory report only
        if path.is_dir() or not path.name.startswith(prefix) or not path.name.endswith(
                "memory-usage-report.txt"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    compiled = {
        "topology": request["topology"], "chips": len(devices),
        "device_kind": devices[0].device_kind,
        "libtpu": metadata.version("libtpu"), "jax": metadata.version("jax"),
        "jaxlib": metadata.version("jaxlib"), "retargeted_annotations": rewritten,
        "compile_s": compile_s, "setup_s": compile_started - started,
        "memory": memory, "cost": {k: float(v) for k, v in dict(cost).items()
                                   if k in ("flops", "transcendentals", "bytes accessed")}}
    tmp = out / "compiled.json.tmp"
    tmp.write_text(json.dumps(compiled, indent=1))
    tmp.replace(out / "compiled.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
