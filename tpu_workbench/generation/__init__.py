"""Generation: what to decode (GenerationSpec), decode runs, and the pure analysis of their token
records."""
