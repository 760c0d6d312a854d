"""The device names TorchTPU reports map to the workbench's chips, and both tables agree on the
bf16 peaks (torch_tpu's own table is the independent source here)."""

from __future__ import annotations

import tpu_workbench as wb
from tpu_workbench import timing


def test_torchtpu_device_names_map_to_the_chip_table():
    # torch.tpu.get_device_name() returns hardware.get_tpu_device_name(): a value of this table.
    from torch_tpu._internal.utils import hardware

    names = set(hardware._PCI_DEVICE_ID_TO_NAME.values())
    assert {"TPU v5e", "TPU v5p", "TPU v6e"} <= names
    for name in ("TPU v5e", "TPU v5p", "TPU v6e"):
        chip = wb.get_chip(name)
        assert chip.name == name.split()[-1]
        assert chip.peak_flops == hardware._BF16_FLOPS_PER_CHIP[hardware.TpuVersion(name)]
        runtime = {"runtime": "torch_tpu", "device": "tpu", "device_kind": name}
        assert timing.peak_flops(runtime) == (chip.peak_flops,
                                              f"{chip.name} x1 bf16 peak (chip table)")
