"""What runs here: probes of the host and its accelerators, the chip and slice tables, TorchTPU's
status, XLA flags, where files go."""
