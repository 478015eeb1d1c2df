"""pyllamaopt."""
