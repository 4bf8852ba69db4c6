"""Learning: ``advantages``, ``losses`` and ``sampler`` are pure functions (ALGORITHMS.md);
``trainer`` batches sequences through them and steps the optimizer."""
