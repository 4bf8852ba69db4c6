"""Learning: ``advantages``, ``losses`` and ``sampler`` are pure functions (formulas: docs/algorithms.md);
``trainer`` batches sequences through them and steps the optimizer.

It may import policy/, config/ and node's leaf modules.
"""
