"""The text format of the built-in arithmetic task, shared by the task source and the base-model builder.

Operands are zero-padded two-digit numbers; answers are zero-padded to a fixed width per operation, so
every answer of one operation has the same length: ``07+35=`` -> ``042``, ``35-07=`` -> ``28``
(subtraction keeps a >= b), ``07*35=`` -> ``0245``.
"""

from __future__ import annotations

OPERATIONS: dict[str, str] = {"add": "+", "sub": "-", "mul": "*"}
ANSWER_WIDTH: dict[str, int] = {"add": 3, "sub": 2, "mul": 4}


def make_problem(op: str, a: int, b: int) -> tuple[str, str]:
    """Return ``(prompt, answer)`` for ``a op b`` with 0 <= a, b <= 99 (``sub`` swaps so a >= b)."""
    if op not in OPERATIONS:
        raise ValueError(f"unknown arithmetic operation {op!r}; expected one of {sorted(OPERATIONS)}")
    if not (0 <= a <= 99 and 0 <= b <= 99):
        raise ValueError(f"operands must be in [0, 99], got {a} and {b}")
    if op == "sub" and a < b:
        a, b = b, a
    value = {"add": a + b, "sub": a - b, "mul": a * b}[op]
    return f"{a:02d}{OPERATIONS[op]}{b:02d}=", f"{value:0{ANSWER_WIDTH[op]}d}"
