"""Planning a TPU run from a laptop: step-time prediction, analytic collectives per step on a
slice."""
