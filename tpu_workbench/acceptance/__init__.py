"""The TPU acceptance run: one check per 'Only on a TPU' item of the README, and its report."""
