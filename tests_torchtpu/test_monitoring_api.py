"""By lookup, without a chip: the libtpu monitoring-SDK names the worker samples
(:mod:`tpu_workbench.worker.monitoring`) and the TorchTPU wait that times every step."""

from __future__ import annotations

import inspect

from tpu_workbench.environment import torchtpu
from tpu_workbench.worker import monitoring
from tpu_workbench.worker import torchtpu as worker_tpu


def test_every_metric_we_sample_is_one_the_installed_libtpu_offers():
    sdk = torchtpu.lookup(monitoring.SDK_MODULE)  # importing it needs no chip (0.3 s here)
    supported = set(sdk.list_supported_metrics())  # get_metric() itself needs a chip
    assert set(monitoring.METRICS) <= supported, set(monitoring.METRICS) - supported


def test_the_sdk_functions_we_call_exist():
    missing = {}
    for name in monitoring.API:
        try:
            torchtpu.lookup(name)
        except (ImportError, AttributeError) as exc:
            missing[name] = str(exc)
    assert not missing


def test_the_wait_that_times_torchtpu_steps_calls_only_checked_names():
    """``TorchTPUBackend.wait``: torch.accelerator.synchronize() (in the adapter's API list,
    looked up by test_torchtpu_env) and then the loss's device-to-host read (``Tensor.to``)."""
    source = inspect.getsource(worker_tpu.TorchTPUBackend.wait)
    assert "torch.accelerator.synchronize()" in source and '.to("cpu")' in source
    assert "torch.accelerator.synchronize" in torchtpu.API
    assert torchtpu.missing_api(("torch.accelerator.synchronize", "torch.Tensor.to")) == {}
