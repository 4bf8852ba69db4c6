"""The core of ``bench_sapo.py``: one run = K nodes in one process, sharing over an in-memory swarm.

A run is described by a ``RunSpec`` (setting, arm, split, seed index, steps, ...). ``run_one`` builds K
``Node``s, each from its node type's config (``configs/tiny-silo.yaml`` for the tiny bases,
``small-silo.yaml`` for small-base, ``smollm2-silo.yaml`` for smollm2-135m) plus the setting's tasks and
the arm's overrides, joins them to one ``InMemoryHub`` through the
same ``SwarmExchange`` a daemon uses -- batches encoded and signed, manifests signed, both verified and
screened by the receiver's peer book (``swarm.intake``) before ingestion re-scores every completion --
steps them round-robin (every node one ``train_step()``, then ``hub.epoch += 1``) and returns every
node's reward curve, final greedy accuracy and the time its exchange took. Silo runs get no exchange.

Pairing: node i of every arm of a seed index has the same seed (``seed_index * 100 + i``), base model and
task mixture, and its task stream comes from its own RNG (peer picks and generation have theirs), so the
silo and sharing arms of a seed draw exactly the same tasks.

Splits: ``I/J`` keeps generation compute equal (I + J groups generated a step, I own plus up to J peer
groups trained on); ``I+J`` shares on top (I generated and all I trained on, plus up to J peer groups).
Either is compared with the silo ``T/0`` that generates as many groups (T = I + J, or I). A variant arm
(``VARIANT_OF``, e.g. ``remix``: the silo with a ReMix adapter) is compared with its baseline at the same
split.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "configs"

from scripts.lib.sapo.progress import (  # noqa: E402
    PER_STEP,
    pauses_into,
    resume,
    save_progress,
    step_into,
    with_segment,
)

# Peer-data treatment, one arm each. The TOPR silo is the baseline of the TOPR and REC arms (on a node's
# own fresh samples the ratio is 1, so TOPR, its uncorrected form and REC train identically there); the
# GRPO silo is the baseline of Gensyn's on-policy treatment.
ARMS: dict[str, list[str]] = {
    "silo": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=true"],
    "silo_grpo": ["train.loss=grpo", "train.advantage=grpo", "train.off_policy_correction=false"],
    "grpo_onpolicy": ["train.loss=grpo", "train.advantage=grpo", "train.off_policy_correction=false"],
    "topr_uncorrected": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=false"],
    "topr_corrected": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=true"],
    "rec": ["train.loss=rec", "train.advantage=rloo", "train.off_policy_correction=true"],
    # Levers on TOPR corrected, each against the plain TOPR silo (issue: "where a goal is missed"): the loss's
    # denominator fixed at I x G sequences, so peer groups on top make a larger step; two optimizer steps a
    # training step; peer groups picked by their re-scored mean reward; peer groups first on the datasets
    # where the node's own groups carry the least signal; only peer groups that beat the node's own mean
    # reward on their dataset.
    "topr_fixed_loss": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=true",
                        "train.loss_denominator=fixed"],
    "topr_2_updates": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=true",
                       "train.optimizer_steps=2"],
    "topr_by_reward": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=true",
                       "sapo.selection=highest_reward"],
    "topr_low_signal": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=true",
                        "sapo.dataset_preference=low_signal"],
    "topr_above_own": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=true",
                       "sapo.peer_filter=above_own"],
    # Peer groups only in the slots of the step's flat own groups, those of datasets inside the node's
    # learning band first; and the same node deciding, from the alignment of peers' gradients with its
    # own, whether to take them at all.
    "topr_fill": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=true",
                  "sapo.peer_slots=flat", "sapo.dataset_preference=learning_band"],
    "topr_decide": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=true",
                    "sapo.peer_slots=flat", "sapo.dataset_preference=learning_band", "sapo.take_peers=decide"],
    # The silo with a ReMix adapter of the same active rank as the node type's LoRA (k LoRAs of rank r/k
    # active of n; see ``node_config``). ReMix runs on the HF backend only.
    "remix": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=true", "adapter.kind=remix",
              "generation.backend=hf"],
    # Whether ReMix only learns more slowly: the LoRA silo and ReMix with the type's learning rate doubled
    # (``LR_SCALE``), ReMix paired with the LoRA at the same rate and that LoRA with the plain silo.
    "lora_lr2": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=true"],
    "remix_lr2": ["train.loss=topr", "train.advantage=rloo", "train.off_policy_correction=true", "adapter.kind=remix",
                  "generation.backend=hf"],
}
LR_SCALE: dict[str, float] = {"lora_lr2": 2.0, "remix_lr2": 2.0}
LEVER_ARMS = ["topr_fixed_loss", "topr_2_updates", "topr_by_reward", "topr_low_signal", "topr_above_own",
              "topr_fill", "topr_decide"]
SILO_OF: dict[str, str] = {"grpo_onpolicy": "silo_grpo", "topr_uncorrected": "silo", "topr_corrected": "silo",
                           "rec": "silo", **{arm: "silo" for arm in LEVER_ARMS}}
SHARING_ARMS = list(SILO_OF)
TREATMENT_ARMS = ["grpo_onpolicy", "topr_uncorrected", "topr_corrected", "rec"]  # the tiny-model grid's
# Arms that change the node, not the sharing: each is compared with its baseline at the same split.
VARIANT_OF: dict[str, str] = {"remix": "silo", "lora_lr2": "silo", "remix_lr2": "lora_lr2"}
BASELINE_OF: dict[str, str] = {**SILO_OF, **VARIANT_OF}
REMIX_N, REMIX_K = 8, 2

# Tiny base models: ``scripts/build/build_tiny_base.py`` options ([] is the shipped tiny-base), built once and
# cached under runs/tiny-bases/ (see ``scripts.lib.tiny_bases.cached_base``). A node type's base that is not a key
# here is a model the node resolves by name (``small-base``, ``smollm2-135m``).
BASES: dict[str, list[str]] = {
    "tiny-base": [],
    # Pretrained on an even add/sub mix until greedy accuracy 0.5 on both: strong on the common mixture.
    "expert": ["--op-mix", "add=0.5,sub=0.5", "--eval-ops", "add,sub", "--target-acc", "0.5"],
    # The same mix, pretrained for 250 steps: about a quarter of the experts' sampled reward.
    "journeyman": ["--op-mix", "add=0.5,sub=0.5", "--eval-ops", "add,sub", "--steps", "250"],
    # The same mix, pretrained for only 150 steps: answers well formed, mostly wrong.
    "novice": ["--op-mix", "add=0.5,sub=0.5", "--eval-ops", "add,sub", "--steps", "150"],
    # 2- and 3-digit addition, pretrained briefly: rare successes on 3-digit addition.
    "add3-novice": ["--op-mix", "add=0.5,add3=0.5", "--eval-ops", "add3", "--steps", "400"],
}


@dataclass(frozen=True)
class NodeType:
    """A kind of node: its base model (a key of ``BASES`` or a model name), its config under ``configs/``
    (the model's adapter, prompt, generation and training settings), if not the setting's, its own task
    weights, and the trained run (``TRAINED``) whose adapter it starts from, if any."""

    base: str
    weights: tuple[float, ...] | None = None
    config: str = "tiny-silo.yaml"
    trained: str | None = None


# Trained runs a node type starts from (``adapter.init_from``): their folder under runs/trained-adapters/ and
# the command that trains it there (once; the bench says so when it is missing).
TRAINED: dict[str, str] = {
    "smollm2-silo20": "swarm-node silo -c configs/smollm2-silo.yaml --run-dir runs/trained-adapters/smollm2-silo20 "
                      "seed=0 generation.backend=hf train.steps=20 train.eval_every=10",
}


NODE_TYPES: dict[str, NodeType] = {
    "tiny-base": NodeType("tiny-base"),
    "expert": NodeType("expert"),
    "journeyman": NodeType("journeyman"),
    "novice": NodeType("novice"),
    "add3-novice": NodeType("add3-novice"),
    "add-heavy": NodeType("tiny-base", (0.8, 0.2)),
    "sub-heavy": NodeType("tiny-base", (0.2, 0.8)),
    # The embedded 5.2M-parameter small-base (2,048-token BPE), and the pretrained SmolLM2-135M-Instruct
    # (49,152-token BPE; fetched from the package index on first use), each with its own shipped config.
    "small-base": NodeType("small-base", config="small-silo.yaml"),
    "smollm2": NodeType("smollm2-135m", config="smollm2-silo.yaml"),
    # smollm2-135m after 20 silo steps on its config's datasets (held-out greedy reward 0.18 -> 0.39): the
    # same model, tokenizer and family as "smollm2", only further along.
    "smollm2-trained": NodeType("smollm2-135m", config="smollm2-silo.yaml", trained="smollm2-silo20"),
}


@dataclass(frozen=True)
class Setting:
    """A swarm: the task mixture, the node type of each node (node i: ``node_types[i % len]``), overrides
    for every node (e.g. the reasoning-gym dataset settings, which must be the same on every node: they are
    part of the tasks' hash) and the goal the issue set for it (``goals`` in ``bench_sapo.py``): ``within``
    (sharing within 2% of the silo), ``weak_gain`` (the weaker type +30%, no type below -2%) or ``gain``
    (+20% at some sharing split); None for none."""

    datasets: tuple[str, ...]
    weights: tuple[float, ...]
    node_types: tuple[str, ...]
    description: str
    overrides: tuple[str, ...] = ()
    goal: str | None = None


SETTINGS: dict[str, Setting] = {
    "homogeneous": Setting(("add",), (1.0,), ("tiny-base",), "every node the shipped tiny-base, on addition",
                           goal="within"),
    "capability": Setting(("add", "sub"), (0.5, 0.5), ("expert", "journeyman"),
                          "experts and journeymen alternating, all on an even add/sub mix", goal="weak_gain"),
    "sparse": Setting(("add3",), (1.0,), ("add3-novice",),
                      "3-digit addition on a base that rarely solves it: most own groups carry no signal"),
    # Not in the default grid: nodes that differ only in their task mixture (for dataset preferences).
    "mixture": Setting(("add", "sub"), (0.5, 0.5), ("add-heavy", "sub-heavy"),
                       "the shipped tiny-base on add-heavy and sub-heavy mixtures alternating"),
    # Two models, two tokenizers: every peer group is re-tokenized, re-scored and anchored by its receiver.
    # The datasets are those where both models have signal and smollm2 the more (docs/results/sapo-models.md,
    # "Datasets where both models have signal"): its sampled reward is 5 to 7 times small-base's there. Each node prompts as its own
    # config does.
    "models": Setting(("spell_backward", "gcd"), (0.5, 0.5), ("smollm2", "small-base", "small-base", "small-base"),
                      "one smollm2-135m node (strong) to three small-base nodes (weak), on spell_backward and gcd",
                      overrides=("tasks.dataset_configs={spell_backward: {max_word_len: 5}, gcd: {max_value: 50}}",),
                      goal="weak_gain"),
    # SAPO's own setting at 135M: homogeneous smollm2-135m nodes on its config's reasoning-gym mixture.
    "smollm2": Setting(("basic_arithmetic", "syllogism", "spell_backward", "gcd"), (0.25, 0.25, 0.25, 0.25),
                       ("smollm2",), "smollm2-135m nodes on the four datasets of configs/smollm2-silo.yaml",
                       goal="gain"),
    # Weak learns from strong within one family: base smollm2 nodes beside smollm2 nodes 20 steps further.
    "smollm2-pair": Setting(("basic_arithmetic", "syllogism", "spell_backward", "gcd"), (0.25, 0.25, 0.25, 0.25),
                            ("smollm2-trained", "smollm2"), "smollm2-135m nodes 20 silo steps along (strong) "
                            "alternating with base smollm2-135m nodes (weak), on configs/smollm2-silo.yaml's datasets",
                            goal="weak_gain"),
    # Long horizons (where a node's own groups run dry): homogeneous small-base nodes on the two datasets of
    # configs/small-silo.yaml, and smollm2-135m on basic_arithmetic alone, where its own signal falls from
    # 0.75-0.875 to 0.0-0.375 within 20 silo steps.
    "small": Setting(("calendar_arithmetic", "propositional_logic"), (0.5, 0.5), ("small-base",),
                     "small-base nodes on the two datasets of configs/small-silo.yaml", goal="within"),
    "smollm2-arith": Setting(("basic_arithmetic",), (1.0,), ("smollm2",),
                             "smollm2-135m nodes on basic_arithmetic (2 terms of 1-2 digits, + and -)", goal="within"),
    # ReMix against one LoRA on a real model: three datasets of different kinds (arithmetic, logic, spelling).
    "smollm2-mix3": Setting(("basic_arithmetic", "syllogism", "spell_backward"), (1 / 3, 1 / 3, 1 / 3), ("smollm2",),
                            "smollm2-135m in silo on basic_arithmetic, syllogism and spell_backward"),
}


def parse_split(text: str) -> tuple[int, int, bool]:
    """``"6/2"`` -> (6, 2, False) (equal compute); ``"8+4"`` -> (8, 4, True) (on top)."""
    on_top = "+" in text
    left, _, right = text.partition("+" if on_top else "/")
    try:
        local, external = int(left), int(right)
    except ValueError:
        raise ValueError(f"split {text!r}: expected I/J (equal compute) or I+J (on top), e.g. 4/4 or 8+4") from None
    if local < 1 or external < 0:
        raise ValueError(f"split {text!r}: I must be >= 1 and J >= 0")
    return local, external, on_top


def generated_groups(split: str) -> int:
    local, external, on_top = parse_split(split)
    return local if on_top else local + external


def silo_split(split: str) -> str:
    """The silo with the same generation compute: ``T/0``."""
    return f"{generated_groups(split)}/0"


@dataclass(frozen=True)
class RunSpec:
    setting: str
    arm: str
    split: str  # "I/J" or "I+J"
    seed_index: int
    nodes: int = 8
    steps: int = 50
    group_size: int = 8
    eval_size: int = 128
    extra: tuple[str, ...] = field(default=())  # further config overrides for every node
    eval_every: int = 0  # held-out evaluation every this many steps (0: at the last step only)

    @property
    def name(self) -> str:
        tag = "" if not self.extra else "-x" + hashlib.sha256("\n".join(self.extra).encode()).hexdigest()[:8]
        return f"{self.setting}-{self.arm}-{self.split.replace('/', 'of').replace('+', 'plus')}{tag}-s{self.seed_index}"

    @property
    def sharing(self) -> bool:
        return parse_split(self.split)[1] > 0


def node_type(spec: RunSpec, index: int) -> str:
    types = SETTINGS[spec.setting].node_types
    return types[index % len(types)]


def base_path(kind: str) -> str:
    """The model folder of a tiny base (a key of ``BASES``), building and caching it on first use; any other
    base is a model name the node resolves itself."""
    if kind not in BASES:
        return kind
    if not BASES[kind]:
        return "tiny-base"
    from scripts.lib.tiny_bases import cached_base

    return str(cached_base(BASES[kind], name=kind))


def node_config(spec: RunSpec, index: int, run_dir: str) -> Any:
    """Node ``index``'s config: its type's config and base, seed = seed_index * 100 + index, the setting's
    tasks, the split, the arm."""
    from node.config import load_config

    setting = SETTINGS[spec.setting]
    kind = NODE_TYPES[node_type(spec, index)]
    local, external, _ = parse_split(spec.split)
    datasets = ",".join(setting.datasets)
    arm = list(ARMS[spec.arm])
    if is_remix(spec.arm):  # the same active rank as the type's LoRA: k of n LoRAs of rank r / k
        rank = load_config(CONFIGS / kind.config).adapter.rank
        if rank % REMIX_K:
            raise ValueError(f"{kind.config}: adapter.rank {rank} is not a multiple of ReMix's k={REMIX_K}")
        arm += [f"adapter.rank={rank // REMIX_K}", f"adapter.remix.k={REMIX_K}", f"adapter.remix.n={REMIX_N}"]
    overrides = [
        f"seed={spec.seed_index * 100 + index}",
        f"run_dir={run_dir}",
        f"model.name_or_path={base_path(kind.base)}",
        f"tasks.datasets=[{datasets}]",
        f"tasks.weights=[{','.join(str(w) for w in kind.weights or setting.weights)}]",
        f"tasks.eval_datasets=[{datasets}]",
        f"tasks.eval_size={spec.eval_size}",
        f"generation.group_size={spec.group_size}",
        f"sapo.local_groups={local}",
        f"sapo.external_groups={external}",
        f"sapo.generated_groups={generated_groups(spec.split)}",
        f"train.steps={spec.steps}",
        f"train.eval_every={spec.eval_every or spec.steps}",
        f"train.checkpoint_every={10 * spec.steps + 1}",
        *setting.overrides,
        *arm,
        *type_overrides(spec.extra, node_type(spec, index)),
    ]
    if kind.trained is not None:
        overrides.append(f"adapter.init_from={trained_run(kind.trained)}")
    cfg = load_config(CONFIGS / kind.config, overrides)
    if spec.arm in LR_SCALE:
        cfg = load_config(CONFIGS / kind.config, [*overrides, f"train.lr={cfg.train.lr * LR_SCALE[spec.arm]!r}"])
    return cfg


def trained_run(name: str) -> Path:
    """The run dir of ``TRAINED[name]``; a missing one stops the bench with the command that trains it."""
    run = ROOT / "runs" / "trained-adapters" / name
    if not (run / "checkpoints").is_dir():
        raise SystemExit(f"bench_sapo: {run.relative_to(ROOT)} is missing; train it first (once): {TRAINED[name]}")
    return run


def is_remix(arm: str) -> bool:
    """Whether ``arm`` runs a ReMix adapter (``remix`` and its learning-rate variant)."""
    return ARMS[arm].count("adapter.kind=remix") == 1


def type_overrides(extra: tuple[str, ...], kind: str) -> list[str]:
    """The overrides of ``extra`` that apply to a node of type ``kind``: ``key=value`` to every node,
    ``TYPE:key=value`` to the nodes of that type only (e.g. ``smollm2:generation.backend=vllm``)."""
    out = []
    for item in extra:
        prefix, sep, rest = item.partition(":")
        if sep and "=" not in prefix:
            if prefix not in NODE_TYPES:
                raise ValueError(f"override {item!r}: unknown node type {prefix!r}; choose from {list(NODE_TYPES)}")
            if prefix == kind:
                out.append(rest)
        else:
            out.append(item)
    return out


def seed_identity(path: Path, seed: int) -> None:
    """Write a node key drawn from the node's ``seed`` at ``path`` unless one is there (a resumed run keeps its own).

    ``sapo.selection=round_robin`` walks the candidate groups' authors in the order of their ids
    (``node.train.sampler``), so with random keys every run of such an arm would draw its own peer groups (the
    default, ``uniform``, does not read the ids). Drawn from the seed, node i has the same id in every arm and rerun."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from protocol.identity import Identity

    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = hashlib.sha256(f"bench_sapo node identity, seed {seed}".encode()).digest()
    Identity(Ed25519PrivateKey.from_private_bytes(secret)).save(path)


def _build_nodes(spec: RunSpec, root: Path) -> tuple[list[Any], Any]:
    from transformers.utils import logging as hf_logging

    from node.run.node import Node
    from swarm.memory import InMemoryHub

    hf_logging.disable_progress_bar()  # one "Loading weights" bar per node otherwise

    hub = InMemoryHub()
    nodes = []
    for i in range(spec.nodes):
        cfg = node_config(spec, i, str(root / f"node{i}"))
        if spec.sharing:
            seed_identity(Path(cfg.run_dir) / cfg.swarm.identity_path, cfg.seed)  # an absolute path stays itself
        node = Node(cfg, show_progress=False, transport=hub.join if spec.sharing else None)
        node.setup()
        nodes.append(node)
    return nodes, hub


def run_one(spec: RunSpec, threads: int = 1, work: Path | None = None, checkpoint_every: int = 0) -> dict[str, Any]:
    """Run ``spec``; return ``rewards[node][step]``, ``signal[node][step]`` (fraction of own groups with
    signal), ``peer_groups`` and ``local_groups[node][step]`` (groups trained on), ``decisions`` and
    ``alignment[node][step]`` (a deciding node's), ``accuracy[node]`` (the last evaluation), ``evals``
    (``[step, [accuracy by node]]`` at every evaluation), node types, the exchange's costs, the run's
    wall-clock and CPU seconds (CPU time does not grow with the load of a shared machine) and its segments
    (a process's part of the run: commit, command, load average at its start and end).

    With ``work``, the nodes' run dirs live there and every ``checkpoint_every`` steps (0: never) each node
    writes a checkpoint and the run's progress is saved: a run stopped any way resumes from there. A resumed
    sharing run is not bit-identical to an uninterrupted one: the peer groups the nodes held for selection
    at the stop (at most ``sapo.staleness_epochs`` epochs' worth) are not kept."""
    import warnings

    import torch

    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers deprecation notices, once a node
    torch.set_num_threads(threads)
    t0, cpu0 = time.perf_counter(), time.process_time()
    with contextlib.ExitStack() as stack:
        if work is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_sapo_")))
            checkpoint_every = 0
        work.mkdir(parents=True, exist_ok=True)
        progress = resume(spec, work)
        nodes, hub = _build_nodes(spec, work)
        stack.callback(lambda: [node.close() for node in nodes])
        if any(node.step != progress["step"] for node in nodes):
            raise RuntimeError(f"{spec.name}: the nodes resumed at steps {[node.step for node in nodes]}, the "
                               f"run's progress at {progress['step']}; delete {work} to start it afresh")
        hub.epoch = progress["step"]
        while progress["step"] < spec.steps:
            evals = []
            for i, node in enumerate(nodes):
                record = node.train_step()
                step_into(progress, i, record)
                if "eval_accuracy" in record:
                    progress["accuracy"][i] = float(record["eval_accuracy"])
                    evals.append(float(record["eval_accuracy"]))
            progress["step"] += 1
            pauses_into(progress, nodes)
            hub.epoch += 1
            if evals:
                progress["evals"].append([progress["step"], evals])
            if checkpoint_every and progress["step"] % checkpoint_every == 0 and progress["step"] < spec.steps:
                for node in nodes:
                    node.save_checkpoint()
                save_progress(work, with_segment(progress, nodes, t0, cpu0))
        progress = with_segment(progress, nodes, t0, cpu0)
    node_steps = spec.nodes * spec.steps
    result = {key: progress[key] for key in (*PER_STEP, "accuracy", "evals", "rejected", "surplus", "seconds",
                                             "cpu_seconds", "segments")}
    result["screen_pauses"] = progress.get("screen_pauses", [])  # progress saved before pauses were kept has none
    result["screen_figures"] = progress.get("screen_figures", [])
    return {"spec": asdict(spec), "name": spec.name, "node_types": [node_type(spec, i) for i in range(spec.nodes)],
            **result, "cost_per_node_step": {k: v / node_steps for k, v in progress["costs"].items()}}
