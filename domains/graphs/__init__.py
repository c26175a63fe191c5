"""Graph domains: attributed graphs with node labels, source → target (CSBM generator, citation and airport readers)."""
