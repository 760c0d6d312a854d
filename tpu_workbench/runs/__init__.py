"""Runs: the spec, worker processes and their pool, the runner, the store of completed runs,
comparisons and the compile-cache study."""
