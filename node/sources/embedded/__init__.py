"""The models shipped in the package: ``catalog`` names them (light, no torch), ``tiny`` and ``small`` say how
each was built and ``small_recipe`` its training recipe; ``build_env`` records what a byte-identical rebuild
needs. Their folders are in ``node/sources/assets/``."""
