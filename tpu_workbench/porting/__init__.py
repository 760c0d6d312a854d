"""Port my model: what blocks it on a TPU, at its line, with the fix, tried where it can be
(:func:`~.report.port`; the findings' columns in :mod:`.findings`)."""
