"""Workshop exercises' judges: pure functions, one module per notebook, never shown on the page."""
