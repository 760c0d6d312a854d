"""Port my model: what blocks it on a TPU, at its line, with the fix, each fix tried on a
patched copy of the model's file and measured (:func:`~.report.port`; the findings' columns in
:mod:`.findings`, the edits in :mod:`.patch`, what a fix did in :mod:`.verdict`, the planted
models that test it in :mod:`.planted`)."""
