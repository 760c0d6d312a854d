"""Serving plans: vLLM-TPU's own model step compiled for a slice (no chip), what it predicts
for latency and throughput at each concurrency, and the published runs it is checked against."""
