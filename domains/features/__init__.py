"""Feature-vector domains: synthetic problems on plain ``(n_samples, n_features)`` arrays."""
