"""Beyond one process: sweeps (local pool or Ray), DTensor layouts over gloo processes, launch plans
for multi-host slices."""
