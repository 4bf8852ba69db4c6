"""The recipe of the embedded ``small-base`` model (light: no torch).

The build itself is ``scripts/lib/small_build.py``; the shipped folder ``node/sources/assets/small-base`` was built
from ``FULL`` and records the recipe and its key (a hash of every field) in its ``build_info.json``, so a
rebuild can tell whether it followed the same recipe.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

# Bump when the build changes in a way the recipe fields do not show (the key then changes with it).
RECIPE_VERSION = 2


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the built files (with the build environment)."""

    name: str
    steps: int
    seed: int = 0
    threads: int = 2
    # Examples per batch by source: about 640 tokens a batch either way (arith texts are 10 tokens,
    # reasoning-gym ones about 26), so addition, which learns slowest, gets many cheap examples.
    batch_size: tuple[tuple[str, int], ...] = (("arith", 64), ("reasoning_gym", 24))
    learning_rate: float = 3e-3
    warmup_steps: int = 30  # then linear decay to a tenth at the last step
    vocab_size: int = 2048
    pool_size: int = 3000  # reasoning-gym items per dataset; arith uses its whole problem set
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    # Share of training batches per "source/dataset": addition learns slowest and has the shortest sequences.
    mix: tuple[tuple[str, float], ...] = (
        ("arith/add", 0.7),
        ("reasoning_gym/calendar_arithmetic", 0.15),
        ("reasoning_gym/propositional_logic", 0.15),
    )
    eval_tasks: int = 100  # per dataset, from the node's held-out split (seed 0)
    version: int = field(default=RECIPE_VERSION)

    def key(self) -> str:
        """Names the recipe: a hash of every field."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return f"{self.name}-{hashlib.sha256(blob).hexdigest()[:12]}"

    @property
    def datasets(self) -> list[str]:
        return [key for key, _ in self.mix]


# The model ``small-base`` names.
FULL = Recipe(name="small-base", steps=1200)
