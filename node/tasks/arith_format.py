"""The text format of the built-in arithmetic task, shared by the task source and the base-model builder.

A dataset is an operation on operands of a fixed number of digits. Operands are zero-padded to that
width and answers to a fixed width per dataset, so every answer of one dataset has the same length:
``07+35=`` -> ``042``, ``35-07=`` -> ``28`` (subtraction keeps a >= b), ``07*35=`` -> ``0245``, and with
three-digit operands ``107+835=`` -> ``0942``, ``835-107=`` -> ``728``.
"""

from __future__ import annotations

OPERATIONS: dict[str, str] = {"add": "+", "sub": "-", "mul": "*"}
DATASETS: dict[str, tuple[str, int]] = {
    "add": ("add", 2),
    "sub": ("sub", 2),
    "mul": ("mul", 2),
    "add3": ("add", 3),
    "sub3": ("sub", 3),
}
"""Dataset name -> (operation, operand digits)."""


def answer_width(op: str, digits: int) -> int:
    """Characters of every answer of ``op`` on ``digits``-digit operands."""
    return {"add": digits + 1, "sub": digits, "mul": 2 * digits}[op]


def make_problem(dataset: str, a: int, b: int) -> tuple[str, str]:
    """Return ``(prompt, answer)`` for ``a op b`` of ``dataset`` (``sub`` swaps so a >= b)."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown arithmetic dataset {dataset!r}; expected one of {sorted(DATASETS)}")
    op, digits = DATASETS[dataset]
    top = 10**digits - 1
    if not (0 <= a <= top and 0 <= b <= top):
        raise ValueError(f"operands of {dataset!r} must be in [0, {top}], got {a} and {b}")
    if op == "sub" and a < b:
        a, b = b, a
    value = {"add": a + b, "sub": a - b, "mul": a * b}[op]
    return f"{a:0{digits}d}{OPERATIONS[op]}{b:0{digits}d}=", f"{value:0{answer_width(op, digits)}d}"
