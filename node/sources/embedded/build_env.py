"""What a byte-identical rebuild of an embedded model needs to match, recorded in its ``build_info.json``."""

from __future__ import annotations


def build_environment() -> dict[str, str]:
    """What a byte-identical rebuild needs to match (recorded in ``build_info.json``): library versions
    and the CPU kernels torch dispatches to (e.g. ``AVX512``); the thread count is recorded separately."""
    import tokenizers
    import torch
    import transformers

    return {
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "tokenizers_version": tokenizers.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def environment_differences(info: dict[str, object]) -> dict[str, tuple[object, str]]:
    """The build-environment fields where ``info`` (a ``build_info.json``) differs from this machine."""
    return {k: (info.get(k), v) for k, v in build_environment().items() if info.get(k) != v}
