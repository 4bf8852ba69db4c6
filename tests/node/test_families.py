"""The family matrix: a tiny random model of every family ``node.policy.families`` names (``tests/node/families.py``
builds them from transformers' own classes) goes through the node's own paths. For each family: it loads
from a folder and from a GGUF the test writes (converted back, the logits are the original's); ``auto``
adapts the family's projections and an explicit list is honoured or refused in one line; a training step
with signal moves the adapter and not the base, through the path the table names (fused or modules');
the sampling loop's log-probs are the training pass's; the special-token mask holds with an output layer
wider than the tokenizer; and an exported run loads in plain peft and computes the node's logits.

A random model earns no reward, so rewards are set by hand where a step needs signal: whether a family
learns a task is not shown here (docs/models.md says so)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from node.config import AdapterConfig, ModelConfig, load_config
from node.errors import PolicyError
from node.generation.rollouts import decode_completion, encode_prompt
from node.generation.sampling import generate
from node.policy.families import FAMILIES, family_named, family_of
from node.policy.logprobs import right_pad, shared_prompt_logprobs
from node.policy.model import Policy, build_policy, load_base
from node.policy.special import banned_ids, stop_ids
from node.train.groups import TrainGroup, assign_advantages
from node.train.trainer import Trainer
from tests.node.conftest import FAST
from tests.node.families import NAMES, TINY, TITLES, build_tiny, family_tokenizer, save_tiny
from tests.node.test_special_tokens import _pushed
from tests.node.tiny_gguf import write_model_gguf

TRANSFORMERS = tuple(int(x) for x in transformers.__version__.split(".")[:2])
GGUF_NEEDS_5_18 = {"llama": "its llama-architecture GGUF states an eos and no bos: 5.17 fails reading a bos id",
                   "mistral": "as llama", "phi3": "as llama",
                   "gemma2": "5.17 converts its byte tokens ('<0x09>') to text ('\\t'): the node's check refuses it",
                   "gemma3": "as gemma2"}
"""The matrix's GGUFs that transformers 5.17 (the lowest admitted, checked by scripts/dev/check_stack.sh) cannot
convert, and why; there the node refuses each in one line (docs/models.md). 5.18 converts them all."""

DEVICE = os.environ.get("SWARM_NODE_TEST_DEVICE", "cpu")
"""Where the policies of the training, sampling and mask rows run: the CPU here; ``scripts/gpu_check.sh`` runs
those rows again with ``SWARM_NODE_TEST_DEVICE=cuda`` (the family matrix on the card)."""


def _policy(folder: Path, **adapter: Any) -> Policy:
    return build_policy(ModelConfig(name_or_path=str(folder), device=DEVICE), AdapterConfig(**adapter), seed=0)


def _generator(policy: Policy, seed: int) -> torch.Generator:
    return torch.Generator(device=policy.device).manual_seed(seed)


def _prompt(policy: Policy, text: str = "What is 12+7?") -> list[int]:
    """A chat prompt as the node encodes it (``encode_prompt``: one BOS in front where the tokenizer has one)."""
    tok = policy.tokenizer
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return encode_prompt(policy, rendered)


def _trainer(policy: Policy, lr: float = 1e-2) -> Trainer:
    return Trainer(policy, lr=lr, norm_lr=lr, router_lr=lr, weight_decay=0.0, max_grad_norm=1.0, loss="topr",
                   eps_low=0.2, eps_high=0.28, length_norm=False, micro_batch_size=8, temperature=1.0)


def _adapter_moved(policy: Policy, scale: float = 0.05) -> None:
    """Move every trainable tensor off its initial value (LoRA's B starts at zero: an adapter that does
    nothing would make a comparison of log-probs or exported logits blind to it)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.requires_grad:
                p.add_((torch.randn(p.shape, generator=generator) * scale).to(p.device))


def _frozen(policy: Policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if not p.requires_grad}


def _adapted(policy: Policy) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name, m in policy.model.named_modules() if hasattr(m, "lora_A")
            and hasattr(m, "get_base_layer")}


def test_every_family_of_the_table_is_in_the_matrix():
    """Catches a family added to node/policy/families.py without its tiny model here (and so untested)."""
    assert sorted(TINY) == sorted(f.name for f in FAMILIES)


def test_the_docs_name_the_tested_families_as_the_table_has_them():
    """docs/models.md's family table says for each family what node/policy/families.py says (its model types,
    the layers ``auto`` adapts, the fused or the modules' training pass) and names no other; the README's
    model rows name exactly these families. Mutation seen failing: a family's ``fused`` flag flipped in the
    table and not in the docs."""
    root = Path(__file__).resolve().parents[2]
    section = (root / "docs" / "models.md").read_text().split("## Model families: what is tested")[1].split("\n## ")[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] not in ("family", "---"):
            rows[cells[0]] = cells
    assert set(rows) == {TITLES[f.name] for f in FAMILIES}
    for family in FAMILIES:
        _, types, auto, path = rows[TITLES[family.name]][:4]
        assert types == ", ".join(f"`{t}`" for t in family.model_types), family.name
        assert auto == ", ".join(t.removesuffix("_proj") for t in family.targets), family.name
        assert path == ("fused" if family.fused else "modules'"), family.name
    gguf_row = next(x for x in (root / "README.md").read_text().splitlines() if x.startswith("| any GGUF |"))
    named = gguf_row.split("(")[1].split(", each on")[0]
    assert named.split(", ") == [TITLES[f.name] for f in FAMILIES]


@pytest.mark.parametrize("name", NAMES)
def test_a_family_loads_from_its_folder_and_from_its_gguf(name, family_folder, tmp_path, monkeypatch):
    """The folder loads as the family it is; the GGUF written from the same model (llama.cpp's layout: Llama's
    q/k rows permuted, Gemma's norms as 1 + w) converts back to the same logits (float32, equal), vocabulary,
    BOS and stop ids.
    Mutations seen failing: the writer's Gemma norm offset dropped (gemma2, gemma3), its q/k permutation
    dropped (llama, mistral), the conversion's BOS repair dropped (gemma2, gemma3: refused), its end-of-turn
    repair dropped (qwen2, gemma2, gemma3: stop ids differ)."""
    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path / "cache"))
    tokenizer = family_tokenizer(name)
    original = build_tiny(name, tokenizer)
    model, tok = load_base(ModelConfig(name_or_path=str(family_folder(name)), device="cpu"))
    assert family_of(model) == family_named(name)
    text = tok.apply_chat_template([{"role": "user", "content": "What is 12+7?"}], tokenize=False,
                                   add_generation_prompt=True)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        want = original(ids).logits
        assert want.std() > 0.5 and torch.equal(model(ids).logits, want)

    gguf = write_model_gguf(original, tokenizer, tmp_path / f"{name}.gguf",
                            name="Mistral 7B Instruct (tiny)" if name == "mistral" else None)
    if name in GGUF_NEEDS_5_18 and TRANSFORMERS < (5, 18):
        with pytest.raises(PolicyError) as refused:  # refused in one line, naming the library's version
            load_base(ModelConfig(name_or_path=str(gguf), device="cpu"))
        assert "\n" not in str(refused.value) and f"transformers {transformers.__version__}" in str(refused.value)
        return
    converted, converted_tok = load_base(ModelConfig(name_or_path=str(gguf), device="cpu"))
    # llama.cpp writes a Mistral as a Llama: it converts to one (the same function without a sliding window)
    assert family_of(converted) == family_named("llama" if name == "mistral" else name)
    # the same vocabulary, id for id (how text splits into pieces is the pre-tokenizer's, which this GGUF
    # does not name: small-base's isolates digits)
    assert converted_tok.get_vocab() == tok.get_vocab() and converted_tok.decode(ids[0]) == tok.decode(ids[0])
    assert converted_tok("a")["input_ids"][:1] == tok("a")["input_ids"][:1]  # a BOS added where the family adds one
    assert stop_ids(converted, converted_tok) == stop_ids(model, tok)
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, want)  # F32 tensors, de-quantized exactly


@pytest.mark.parametrize("name", NAMES)
def test_auto_adapts_the_familys_projections_and_a_list_is_honoured_or_refused(name, family_folder):
    """``auto`` puts LoRA on the family's attention and MLP projections (Phi-3's fused qkv_proj and
    gate_up_proj); an explicit list is taken as it is; a name the model lacks is one line; ReMix routes on
    the family's MLP projections. Mutation seen failing: ``resolve_targets`` answering a Llama's names for
    every family (phi3 refused)."""
    family, folder = family_named(name), family_folder(name)
    assert _adapted(_policy(folder)) == set(family.targets)
    assert _adapted(_policy(folder, target_modules=[family.attention[-1]])) == {family.attention[-1]}
    with pytest.raises(PolicyError, match=r"\['nonexistent_proj'\] are not modules of this model") as refused:
        _policy(folder, target_modules=[family.attention[0], "nonexistent_proj"])
    assert "\n" not in str(refused.value)
    remix = _policy(folder, kind="remix", rank=2, remix={"n": 2, "k": 1})
    assert remix.remix.projections == family.mlp
    with torch.no_grad():
        remix.remix.set_prompt_mask(torch.ones(1, 4, dtype=torch.bool))
        logits = remix.model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits  # -inf where the mask bans
        assert not logits.isnan().any() and torch.isfinite(logits).sum() >= 4 * (len(remix.tokenizer) - 8)


@pytest.mark.parametrize("name", NAMES)
def test_a_step_with_signal_moves_the_adapter_and_not_the_base(name, family_folder):
    """One trainer step on a group with rewards set by hand: every adapter layer's tensors move, no base
    weight does, through the path the table names (``fused``: node.fused; else the modules'). Mutations
    seen failing: the modules' optimizer step skipped (mistral), the fused pass refusing every model (llama,
    qwen2: the table says fused)."""
    policy = _policy(family_folder(name))
    trainer = _trainer(policy)
    assert (trainer.fused is not None) == family_named(name).fused
    prompt = _prompt(policy)
    out = generate(policy.model, policy.tokenizer, [prompt] * 4, max_new_tokens=6, generator=_generator(policy, 0))
    rows = [out.row(i) for i in range(4)]
    group = TrainGroup(key="k", peer_id="", epoch=0, prompt_ids=prompt, completions=[r[0] for r in rows],
                       anchor_logprobs=[r[1] for r in rows], rewards=[1.0, 0.0, 1.0, 0.0])
    frozen = _frozen(policy)
    before = policy.trainable_state()
    stats = trainer.step(assign_advantages([group], "rloo"))
    after = policy.trainable_state()
    assert stats["n_tokens"] > 0 and stats["skipped_steps"] == 0
    moved = {k.split(".lora_")[0].rsplit(".", 1)[-1] for k in after if ".lora_B" in k and not torch.equal(before[k], after[k])}
    assert moved == set(family_named(name).targets)
    assert all(torch.equal(frozen[k], v) for k, v in _frozen(policy).items())


@pytest.mark.parametrize("name", NAMES)
def test_the_sampling_loops_logprobs_are_the_training_passs(name, family_folder):
    """The behaviour log-probs the HF sampling loop records (KV cache, one token a step, Gemma's sliding
    window shorter than the sequence) equal those of the training pass over the same tokens (float32), the
    modules' and, where the family is fused, the fused pass's. Mutation seen failing: the shared-prompt
    pass running the completions without their position ids (left-padded prompts shift them: all seven)."""
    policy = _policy(family_folder(name))
    trainer = _trainer(policy)
    _adapter_moved(policy)
    tok = policy.tokenizer
    prompts = [_prompt(policy), _prompt(policy), _prompt(policy, "Add 3 and 40."), _prompt(policy, "Hi")]
    out = generate(policy.model, tok, prompts, max_new_tokens=10, generator=_generator(policy, 3))
    mask = out.completion_mask
    assert int(mask.sum(1).max()) >= 8, "completions long enough to pass Gemma's window of 8"
    with torch.no_grad():
        modules = shared_prompt_logprobs(policy.model, prompts, out.completion_ids, mask, pad_id=tok.pad_token_id)
        assert (modules - out.behavior_logprobs)[mask].abs().max() <= 1e-5
        if trainer.fused is not None:
            rows = [out.row(i)[0] for i in range(len(prompts))]
            fused = trainer.fused.logprobs(prompts, rows, pad_id=tok.pad_token_id)
            expected, _ = right_pad([out.row(i)[1] for i in range(len(prompts))], 0.0, torch.float32)
            assert (fused - expected)[mask[:, : fused.shape[1]]].abs().max() <= 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_the_bases_read_from_a_kept_prefix_is_the_read_of_each_prompt_whole(name, family_folder):
    """The screen's frozen base reads peer and own text with the prefix its prompts share kept between reads
    (``ingest.screen_prefix_cache``): on each family, adapters moved off zero so that reading through them would
    show, the log-probs equal those of the same reads with every prompt run whole, over three reads: the prefix
    run once for the first two, and started afresh by prompts that do not share it; off on a family with a sliding
    window (Gemma 2 and 3 here), where each prompt's padding after the prefix would take places in the window.
    Mutations seen failing: the rest of each prompt run at positions from 0 (five families); the kept cache
    handed to the pass, not a copy, so that each read extends it (five); the window not switched off (Gemma 2
    and 3)."""
    from node.exchange.ingest import IngestLimits
    from node.exchange.plausibility import ScreenSettings
    from node.exchange.screening import ScreenBook

    policy = _policy(family_folder(name))
    _adapter_moved(policy)
    tok = policy.tokenizer
    books = [ScreenBook(policy, ScreenSettings(prefix_cache=kept), temperature=0.7, micro_batch_size=8,
                        anchor_bytes=IngestLimits().anchor_bytes, max_authors=8) for kept in (False, True)]
    prefix = books[1].prefix
    assert prefix is not None and books[0].prefix is None
    system = ("You are a careful problem solver. Think it through step by step if you need to, then give only "
              "the final answer inside answer tags, as in the example before. ")
    asked = [_prompt(policy, system + q) for q in ("What is 12+7?", "Add 3 and 40, please.", "Hi")]
    words = tok.encode(" The sum is 19, so the answer is <answer>19</answer> and that is all.", add_special_tokens=False)
    other = "Answer in one word and nothing else, whatever the question is and however long it looks to you. "
    later = [_prompt(policy, other + q) for q in ("Hi", "Hello there")]
    reads = [[(asked[0], words[:12]), (asked[0], words[2:14]), (asked[1], words[:3]), (asked[0], words[5:6])],
             [(asked[1], words[1:13]), (asked[0], words[:9])],
             [(later[0], words[:10]), (later[1], words[3:12])]]
    windowed = name in ("gemma2", "gemma3")
    for i, rows in enumerate(reads):
        whole, kept = (book.base_logprobs(rows) for book in books)
        assert [len(r) for r in whole] == [len(c) for _, c in rows] == [len(r) for r in kept]
        gap = max(abs(a - b) for w, k in zip(whole, kept) for a, b in zip(w, k))
        assert gap <= 1e-5, (i, gap)
        if i == 1 and not windowed:
            assert prefix.computed == 1 and len(prefix.tokens) >= 16, "the first two reads share one prefix run"
    if windowed:
        assert prefix.off and prefix.computed == 0
    else:
        assert prefix.computed == 2 and prefix.tokens == tuple(os.path.commonprefix(later)), "started afresh"


@pytest.mark.parametrize("name", NAMES)
def test_the_bases_read_in_bfloat16_is_near_the_float32_read_and_leaves_the_policy_as_it_was(name, family_folder):
    """``ingest.screen_read_dtype=bfloat16``: a float32 policy's base reads run under bfloat16 autocast. On each
    family the two reads of the same rows differ (so the reads did run in bfloat16), by less than 0.3 nats in a
    token and 0.05 in mean (here at most 0.06 and 0.02); the second read starts from the prefix the first kept,
    computed in bfloat16 too (but on Gemma 2 and 3, whose window turns the kept prefix off); and the policy's
    weights are still float32 and unchanged after them. Mutations seen failing: the key not
    passed to the autocast (every family: the reads equal); the model cast to bfloat16 in place for the reads (every
    family: the float32 book's next read equals it)."""
    from node.exchange.ingest import IngestLimits
    from node.exchange.plausibility import ScreenSettings
    from node.exchange.screening import ScreenBook

    policy = _policy(family_folder(name))
    _adapter_moved(policy)
    weights = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    books = [ScreenBook(policy, ScreenSettings(read_dtype=dtype), temperature=0.7, micro_batch_size=8,
                        anchor_bytes=IngestLimits().anchor_bytes, max_authors=8) for dtype in ("model", "bfloat16")]
    system = ("You are a careful problem solver. Think it through step by step if you need to, then give only "
              "the final answer inside answer tags, as in the example before. ")
    asked = [_prompt(policy, system + q) for q in ("What is 12+7?", "Add 3 and 40, please.")]
    words = policy.tokenizer.encode(" The sum is 19, so the answer is <answer>19</answer>.", add_special_tokens=False)
    for rows in ([(asked[0], words[:12]), (asked[1], words[2:9])], [(asked[1], words[:10]), (asked[0], words[4:8])]):
        full, half = (book.base_logprobs(rows) for book in books)
        gaps = [abs(a - b) for f, h in zip(full, half, strict=True) for a, b in zip(f, h, strict=True)]
        assert max(gaps) > 1e-4, "the bfloat16 reads equal the float32 ones: they did not run in bfloat16"
        assert max(gaps) < 0.3 and sum(gaps) / len(gaps) < 0.05, (max(gaps), sum(gaps) / len(gaps))
    kept = books[1].prefix
    assert kept is not None and kept.computed == (0 if name in ("gemma2", "gemma3") else 1)
    for n, p in policy.model.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(p, weights[n]), n


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("greedy", [False, True])
def test_the_mask_holds_with_an_output_layer_wider_than_the_tokenizer(name, greedy, family_folder):
    """The output layer has ids past the tokenizer (as Qwen2.5's and Phi-3's have): pushed towards those and
    towards the banned special tokens, the base model's argmax is one of them, yet the policy samples none;
    its logits there are -inf, its stop ids' finite. Mutations seen failing: ``sampling_bias`` without its
    -inf past the tokenizer (ids a peer rejects as ``bad_token_id``, an offence); the mask added before
    Gemma 2's soft cap (-30, not -inf: gemma2)."""
    folder = family_folder(name)
    policy = _policy(folder)
    tok = policy.tokenizer
    width = int(policy.model.get_output_embeddings().weight.shape[0])
    assert width > len(tok)
    stops = stop_ids(policy.model, tok)
    forbidden = [*banned_ids(tok, stops), *range(len(tok), width)]
    prompts = [_prompt(policy)] * 6
    with _pushed(width, forbidden, boost=30.0, device=DEVICE):
        raw, _ = load_base(ModelConfig(name_or_path=str(folder), device="cpu"))
        with torch.no_grad():
            assert int(raw(input_ids=torch.tensor(prompts[:1])).logits[0, -1].argmax()) in forbidden
        out = generate(policy.model, tok, prompts, max_new_tokens=8, greedy=greedy, generator=_generator(policy, 0))
        with torch.no_grad():  # -inf, not merely low: Gemma 2 soft-caps its logits after the output layer
            logits = policy.model(input_ids=torch.tensor(prompts[:1], device=policy.device)).logits[0, -1].cpu()
    assert torch.isneginf(logits[forbidden]).all() and torch.isfinite(logits[list(stops)]).all()
    drawn = out.completion_ids[out.completion_mask].tolist()
    assert drawn and not set(drawn) & set(forbidden)
    assert torch.isfinite(out.behavior_logprobs[out.completion_mask]).all()


@pytest.mark.parametrize("name", NAMES)
def test_an_exported_run_loads_in_plain_peft_and_computes_the_nodes_logits(name, family_folder, tmp_path):
    """A node run of the family (one silo step, its adapter and norms moved off their initial values first),
    exported with ``swarm-node export``: plain transformers + peft load it offline and compute the node's
    logits where the node allows a token (float32); the model card names the layers ``auto`` chose.
    Mutation seen failing: the export writing the initial (unmoved) adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from node.cli import main
    from node.run.node import Node
    from node.run.saved import load_policy, open_run

    folder, run_dir, out = family_folder(name), tmp_path / "run", tmp_path / "export"
    cfg = load_config("configs/small-silo.yaml", [*FAST, f"model.name_or_path={folder}", f"run_dir={run_dir}",
                                                  "tasks.source=arith", "tasks.datasets=[add]", "train.steps=1",
                                                  "train.checkpoint_every=1", "train.eval_every=100",
                                                  "generation.max_new_tokens=4", "sapo.local_groups=2"])
    assert cfg.adapter.target_modules == "auto"
    node = Node(cfg, show_progress=False)
    node.setup()
    try:
        _adapter_moved(node.policy)
        node.generator.sync()
        node.run()
    finally:
        node.close()
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    policy = load_policy(open_run(run_dir))
    ids = torch.tensor([_prompt(policy)])
    base = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    plain = PeftModel.from_pretrained(base, str(out)).eval()
    with torch.no_grad():
        ours, theirs = policy.model(input_ids=ids).logits, plain(input_ids=ids).logits
        unmoved = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)(input_ids=ids).logits
    allowed = torch.isfinite(ours)
    assert (ours - theirs)[allowed].abs().max() <= 1e-5
    assert (ours - unmoved)[allowed].abs().max() > 1e-3  # the adapter is in what was compared
    card = (out / "README.md").read_text()
    line = next(x for x in card.splitlines() if x.startswith("- adapter: lora"))
    assert set(line.split("targets ")[1].split(" (auto")[0].split(", ")) == set(family_named(name).targets)


def test_auto_on_a_model_of_no_known_family_adapts_its_decoder_layers_linear_layers(tmp_path, caplog):
    """GPT-NeoX is in no family of the table: ``auto`` adapts every linear layer inside its decoder layers
    (its own names), says so in the log, and the model trains through the modules' path. Mutation seen
    failing: ``decoder_linear_names`` also taking linear layers outside the decoder layers (its output layer)."""
    from transformers import AutoModelForCausalLM, GPTNeoXConfig

    tokenizer = family_tokenizer("llama")
    config = GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    folder = save_tiny(AutoModelForCausalLM.from_config(config), tokenizer, tmp_path / "neox")
    with caplog.at_level(logging.WARNING, logger="node.policy.families"):
        policy = _policy(folder)
    assert family_of(policy.model) is None and "of no family the node has tested" in caplog.text
    assert _adapted(policy) == {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}
    trainer = _trainer(policy)
    assert trainer.fused is None
    prompt = _prompt(policy)
    group = TrainGroup(key="k", peer_id="", epoch=0, prompt_ids=prompt, completions=[[5, 6], [7, 8]],
                       anchor_logprobs=[[-1.0, -1.0], [-1.0, -1.0]], rewards=[1.0, 0.0])
    before = policy.trainable_state()
    trainer.step(assign_advantages([group], "rloo"))
    after = policy.trainable_state()
    assert any(not torch.equal(before[k], after[k]) for k in after)


def test_a_completion_decodes_without_the_familys_second_end_of_turn_id(family_folder):
    """Gemma's instruct models end a turn at ``<end_of_turn>`` (a special token) beside ``<eos>``: the policy
    stops there, and the scored text drops it as it drops the eos."""
    policy = _policy(family_folder("gemma2"))
    tok = policy.tokenizer
    end = tok.convert_tokens_to_ids("<end_of_turn>")
    assert end in tok.all_special_ids and stop_ids(policy.model, tok) == (tok.eos_token_id, end)
    with _pushed(int(policy.model.get_output_embeddings().weight.shape[0]), [end], boost=30.0):
        out = generate(policy.model, tok, [_prompt(policy)] * 3, max_new_tokens=6,
                       generator=torch.Generator().manual_seed(0))
    assert out.finish_reasons == ["eos"] * 3 and all(out.row(i)[0][-1] == end for i in range(3))
    assert decode_completion(policy, [*tok("12", add_special_tokens=False)["input_ids"], end]) == "12"
