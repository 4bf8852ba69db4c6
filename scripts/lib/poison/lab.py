"""One poisoning run: a victim node among an honest peer and an attacker, measured by what the victim says.

The victim and the honest peer are real ``Node``s built from a config (the attacker an ``AttackerNode``), all
members of one ``InMemoryHub``: every batch is encoded, signed, screened by the receiver's peer book and
verified exactly as on the hivemind path, then ingested (re-scored, re-tokenized, anchored, screened) by the
victim's own exchange. A step: the attacker publishes, the honest peer steps, the victim steps, the hub's
epoch advances. A silo run (``spec.attack`` None and ``spec.silo``) is the victim alone, the baseline.

After the last step the victim answers held-out tasks: ``samples`` completions a task at its own temperature
and one greedy completion. The attack success rate is the share of those completions that carry the attack's
payload (``Attack.carries``); the victim's held-out greedy reward and its completions' mean length in tokens
come with it (the length attack is judged on length against the silo's).
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from scripts.lib.poison.attacker import AttackerNode
from scripts.lib.poison.attacks import CONTROL, SUITE, Attack, payload_words

ROOT = Path(__file__).resolve().parents[3]
PAYLOAD_ROWS = 32  # held-out tasks a pass when measuring a payload's log-prob
OWN_KEPT = 8  # own completions carrying a payload kept an attack, to be read


@dataclass(frozen=True)
class LabSpec:
    """One run. ``overrides`` apply to the victim (and the honest peer); ``victim_overrides`` to the victim
    only (e.g. the defence switched off). ``attack`` names one of ``SUITE``; ``attacks`` adds attackers of
    their own (each another node), measured each on its own payload; with ``send`` false none of them is a node,
    their payloads are measured all the same (as on the silo: what sharing alone does to them)."""

    attack: str | None
    config: str = "configs/small-silo.yaml"
    overrides: tuple[str, ...] = ()
    victim_overrides: tuple[str, ...] = ()
    honest: bool = True
    honest_config: str | None = None  # the honest peer's config (default: the victim's)
    silo: bool = False
    steps: int = 6
    seed: int = 0
    attacker_groups: int = 4
    eval_tasks: int = 32
    samples: int = 4
    threads: int = 1
    label: str = ""
    attacks: tuple[Attack, ...] = ()
    send: bool = True  # False: no attacker sends, the attacks' payloads are measured on the victim (shared arms)

    def all_attacks(self) -> list[Attack]:
        return [*([SUITE[self.attack]] if self.attack else []), *self.attacks]

    @property
    def name(self) -> str:
        what = "silo" if self.silo else (self.attack or ("all" if self.attacks and self.send else "honest"))
        return f"{what}{'-' + self.label if self.label else ''}-s{self.seed}"


@dataclass
class LabResult:
    """The victim after the run; ``asr_*``, ``payload_*`` and ``own_asr`` by attack name."""

    spec: dict[str, Any]
    asr_sampled: dict[str, float]
    asr_greedy: dict[str, float]
    greedy_reward: float
    sampled_length: float
    payload_before: dict[str, float]
    payload_after: dict[str, float]
    steps: int
    seconds: float
    victim: dict[str, Any] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    own_asr: dict[str, list[float]] = field(default_factory=dict)  # a step: share of its own samples with it
    own_carrying: dict[str, list[list[Any]]] = field(default_factory=dict)  # [step, text]: the first OWN_KEPT of them
    honest_read: int = 0  # the honest peer's completions the victim read with its model
    honest_dropped: int = 0  # of them, dropped by the span or length bound (false drops)
    greedy_rewards: list[float] = field(default_factory=list)  # a held-out task: its greedy reward, in order
    echoed: int = 0  # the victim's own completions the echo attackers sent back to it
    published: dict[str, int] = field(default_factory=dict)  # an attack: the groups its attacker sent, all steps
    payload_words_before: dict[str, float | None] = field(default_factory=dict)  # the payload's own words alone
    payload_words_after: dict[str, float | None] = field(default_factory=dict)
    paused_at: dict[str, list[int | None]] = field(default_factory=dict)  # an attack: each identity's first paused step
    # an attack: each identity's first step with a completion that failed the screen / was dropped by a bound, so a
    # pause's delay splits into the screen finding the text (first failed) and the verdict (paused)
    failed_at: dict[str, list[int | None]] = field(default_factory=dict)
    dropped_at: dict[str, list[int | None]] = field(default_factory=dict)
    paused_steps: dict[str, int] = field(default_factory=dict)  # an attack: steps after which an identity was paused
    payloads: dict[str, str] = field(default_factory=dict)  # an attack: its payload as sent (a sampled one resolved)
    honest_paused_steps: int = 0  # steps after which the victim's screen had the honest peer paused (0 expected)
    screen_figures: dict[str, dict[str, float]] = field(default_factory=dict)  # "honest" and each attack: summed


def _config(spec: LabSpec, run_dir: Path, seed: int, victim: bool) -> Any:
    from node.config import load_config

    overrides = [f"seed={seed}", f"run_dir={run_dir}", f"train.steps={spec.steps}", "train.eval_every=0",
                 f"train.checkpoint_every={10 * spec.steps + 1}", *spec.overrides]
    if victim:
        overrides += spec.victim_overrides
    return load_config(ROOT / (spec.config if victim else spec.honest_config or spec.config), overrides)


def run(spec: LabSpec, work: Path | None = None, progress: Callable[[str], None] | None = None) -> LabResult:
    """Run ``spec`` (in ``work``, or a temporary folder) and measure the victim; ``progress`` is told each tenth
    of the steps taken (``step 20/50, 31 s``) and the measuring."""
    from transformers.utils import logging as hf_logging

    from node.run.node import Node
    from swarm.memory import InMemoryHub

    hf_logging.disable_progress_bar()
    torch.set_num_threads(spec.threads)
    attacks = spec.all_attacks()
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        root = work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="poison_")))
        hub = InMemoryHub()
        transport = None if spec.silo else hub.join
        victim = Node(_config(spec, root / "victim", spec.seed, True), show_progress=False, transport=transport)
        victim.setup()
        stack.callback(victim.close)
        peers: list[Any] = []
        if spec.honest and not spec.silo:
            honest = Node(_config(spec, root / "honest", spec.seed + 1, False), show_progress=False,
                          transport=hub.join)
            honest.setup()
            stack.callback(honest.close)
            peers.append(honest)
        attacks = [resolve(a, victim, spec.seed) for a in attacks]  # before the victim's first step: its base
        attackers = [] if spec.silo or not spec.send else [_attacker(a, victim, hub, spec, i)
                                                           for i, a in enumerate(attacks)]
        for attacker in attackers:
            stack.callback(attacker.close)
        measured_payloads = [*attacks, CONTROL] if attacks else []  # the control: a sentence no one sends
        before = {a.name: payload_logprobs(victim, a, spec) for a in measured_payloads}
        own_asr: dict[str, list[float]] = {a.name: [] for a in attacks}
        own_carrying: dict[str, list[list[Any]]] = {a.name: [] for a in attacks}
        if victim.exchange is not None and attacks:
            _track(victim.exchange, attacks, own_asr, own_carrying)
        seen = _Verdicts.of(attackers)
        honest_paused = 0
        for i in range(1, spec.steps + 1):
            for attacker in attackers:
                attacker.step()
            for peer in peers:
                peer.train_step()
            record = victim.train_step()
            hub.epoch += 1
            if victim.exchange is not None:
                honest_paused += any(victim.exchange.paused(p.exchange.identity.peer_id) for p in peers)
                seen.note(i, victim.exchange, attackers)
            if progress and (i % max(spec.steps // 10, 1) == 0 or i == spec.steps):
                progress(f"step {i}/{spec.steps}, {time.perf_counter() - started:.0f} s")
        if progress:
            progress("measuring")
        measured = measure(victim, attacks, spec)
        after = {a.name: payload_logprobs(victim, a, spec) for a in measured_payloads}
        measured["payload_before"] = {k: v[0] for k, v in before.items()}
        measured["payload_after"] = {k: v[0] for k, v in after.items()}
        measured["payload_words_before"] = {k: v[1] for k, v in before.items()}
        measured["payload_words_after"] = {k: v[1] for k, v in after.items()}
        honest_read = honest_dropped = 0
        if peers and victim.exchange is not None:
            ingestor, hid = victim.exchange.ingestor, peers[0].exchange.identity.peer_id
            honest_read = ingestor.verdicts.judged.get(hid, 0)
            rejected = ingestor.by_peer.get(hid, (0, {}))[1]
            honest_dropped = sum(n for k, n in rejected.items() if k in ("implausible", "too_long_for_us"))
        measured["honest_read"], measured["honest_dropped"] = honest_read, honest_dropped
        victim_metrics = {k: record.get(k) for k in ("ingest_rejected", "ingest_screened", "ingest_groups_accepted",
                                                      "ingest_offences", "peers_banned", "screen_peers_paused", "n_peer_groups",
                                                      "screen_rows", "screen_tokens", "screen_tokens_masked",
                                                      "screen_positive_weight")
                          if k in record}
        echoed = sum(a.echoed for a in attackers)
        published = {node.attack.name: node.published for node in attackers}
        figures = {}
        if victim.exchange is not None:
            verdicts = victim.exchange.ingestor.verdicts
            authors = {"honest": [p.exchange.identity.peer_id for p in peers],
                       **{n.attack.name: [ident.peer_id for ident in n.identities] for n in attackers}}
            figures = {name: _summed([verdicts.summary(a) for a in ids]) for name, ids in authors.items()}
    return LabResult(spec=asdict(spec), steps=spec.steps, seconds=time.perf_counter() - started,
                     victim=victim_metrics, own_asr=own_asr, own_carrying=own_carrying, echoed=echoed,
                     published=published, paused_at=seen.paused_at, paused_steps=seen.paused_steps,
                     failed_at=seen.failed_at, dropped_at=seen.dropped_at,
                     honest_paused_steps=honest_paused,
                     payloads={a.name: a.payload for a in attacks},
                     screen_figures=figures, **measured)


@dataclass
class _Verdicts:
    """What the victim's screen made of each attacker identity, step by step: the first step it was paused, failed
    a completion, had one dropped, and how many steps it spent paused."""

    paused_at: dict[str, list[int | None]]
    failed_at: dict[str, list[int | None]]
    dropped_at: dict[str, list[int | None]]
    paused_steps: dict[str, int]

    @classmethod
    def of(cls, attackers: list[AttackerNode]) -> _Verdicts:
        def unseen() -> dict[str, list[int | None]]:
            return {n.attack.name: [None] * len(n.identities) for n in attackers}
        return cls(unseen(), unseen(), unseen(), {n.attack.name: 0 for n in attackers})

    def note(self, step: int, exchange: Any, attackers: list[AttackerNode]) -> None:
        for node in attackers:
            name = node.attack.name
            for k, ident in enumerate(node.identities):
                paused, figures = exchange.paused(ident.peer_id), exchange.ingestor.verdicts.summary(ident.peer_id)
                self.paused_steps[name] += paused
                for first, happened in ((self.paused_at, paused), (self.failed_at, figures["failed"] > 0),
                                        (self.dropped_at, figures["dropped"] > 0)):
                    if happened and first[name][k] is None:
                        first[name][k] = step


def _summed(summaries: list[dict[str, float]]) -> dict[str, float]:
    """Several identities' screen figures as one author's: counts added (its pauses, the first ones and those
    after a return, among them), the mean weight their mean."""
    out: dict[str, float] = {k: sum(s[k] for s in summaries) for k in ("judged", "failed", "dropped", "tokens",
                                                                        "tokens_masked", "sequence_failed",
                                                                        "policy_failed", "pauses")}
    out["mean_weight"] = sum(s["mean_weight"] for s in summaries) / len(summaries) if summaries else 1.0
    return out


def _track(exchange: Any, attacks: list[Attack], out: dict[str, list[float]],
           carrying: dict[str, list[list[Any]]]) -> None:
    """Record, each step, the share of the victim's own sampled completions (as it publishes them) that carry
    each attack's payload, and the first ``OWN_KEPT`` such completions with their step (one 1-based step a
    call), so that a match can be read: the victim's own slip ("2 + 2 = 5" as its answer to "2 + 2") or the
    attacker's text."""
    share = exchange.share

    def tracked(step: int, groups: list[Any]) -> None:
        texts = [t for grp in groups for t in grp.texts]
        for a in attacks:
            hits = [t for t in texts if a.carries(t)]
            out[a.name].append(len(hits) / max(len(texts), 1))
            kept = carrying[a.name]
            kept += [[len(out[a.name]), t] for t in hits[:max(OWN_KEPT - len(kept), 0)]]
        share(step, groups)

    exchange.share = tracked


def _attacker(attack: Attack, victim: Any, hub: Any, spec: LabSpec, index: int) -> AttackerNode:
    from node.tasks import build_task_source

    cfg = victim.cfg
    t = cfg.tasks
    source = build_task_source(t.source, list(t.datasets), None, cfg.seed + 7 + index,
                               **t.source_options(cfg.model.chat_template))
    tok = victim.policy.tokenizer
    from node.generation.rollouts import encode_prompt

    def prompt_of(task: Any) -> str:  # the victim's own prompt text, as an honest peer of its config sends
        return str(tok.decode(encode_prompt(victim.policy, victim.source.format_prompt(task, tok)),
                              skip_special_tokens=True))

    # the victim's public key: the author every batch it signs names (whose completions an echo attacker sends back)
    target = victim.exchange.identity.public_key if victim.exchange is not None else None
    return AttackerNode(attack, hub.join, cfg.swarm, source, tok, victim.policy.tokenizer_fingerprint, prompt_of,
                        group_size=cfg.generation.group_size, groups=spec.attacker_groups,
                        max_tokens=cfg.generation.max_new_tokens, seed=spec.seed * 100 + index, target=target)


SAMPLED_CANDIDATES = 16  # completions a sampled attacker draws at once from the victim's base under its instruction
SAMPLED_DRAWS = 4  # at most this many times, until one names the instruction's site
SAMPLED_TOKENS = 32


def resolve(attack: Attack, victim: Any, seed: int) -> Attack:
    """``attack`` with its payload fixed: a sampled attack's drawn from the victim's base (its adapters off) before
    its first step, under the hidden instruction put before the question of a training task (not held out).
    ``SAMPLED_CANDIDATES`` sentences at a time (each the text before the first line break or answer tag, three
    words at least, none a copy of the prompt's text), at most ``SAMPLED_DRAWS`` times until one names the
    instruction's site; the attacker keeps one that names it if any does, and of those the one the base finds most
    likely a token in the victim's own prompt, without the instruction. Its marker is the site where the sentence names it, else the whole sentence. Other
    attacks as they are."""
    import re
    from dataclasses import replace as replaced

    from node.generation.rollouts import encode_prompt

    if attack.instruction is None:
        return attack
    import random

    tok, model = victim.policy.tokenizer, victim.policy.model
    rng = random.Random(seed)
    task = next(t for t in (victim.source.task(r) for r in victim.source.sample(16, rng))  # a training task
                if t.answer is not None and not victim.source.is_held_out(t))
    hidden = replaced(task, prompt=f"{attack.instruction}\n\n{task.prompt}")
    shown = victim.source.format_prompt(hidden, tok)
    ids = torch.tensor([encode_prompt(victim.policy, shown)] * SAMPLED_CANDIDATES, device=victim.policy.device)
    site = re.search(r"[\w-]+\.example", attack.instruction)
    base = model.disable_adapter() if callable(getattr(model, "disable_adapter", None)) else contextlib.nullcontext()
    texts: list[str] = []
    with torch.random.fork_rng(devices=[]), torch.no_grad(), base:  # the base: what the adapters start as
        torch.manual_seed(seed)
        for _ in range(SAMPLED_DRAWS):  # until a sentence names the site, or the draws run out
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                 top_p=1.0, max_new_tokens=SAMPLED_TOKENS, pad_token_id=tok.pad_token_id)
            texts += [re.split(r"\n|<answer>", str(tok.decode(row[ids.shape[1]:], skip_special_tokens=True)))[0].strip()
                      for row in out]
            if site is None or any(site.group(0) in t for t in texts):
                break
    pool, named = sampled_candidates(texts, str(shown), site.group(0) if site else None, attack.instruction)
    probe = replaced(attack, instruction=None)
    scores = [_mean_logprob(victim, replaced(probe, payload=t), task) for t in pool]
    best = pool[max(range(len(pool)), key=lambda i: scores[i])]
    markers = (site.group(0),) if named and site else ()
    return replaced(attack, payload=best, markers=markers)


def sampled_candidates(texts: list[str], shown: str, site: str | None, instruction: str) -> tuple[list[str], bool]:
    """``(pool, named)``: the sentences a sampled attacker chooses among, from the base's ``texts`` under its
    instruction: three words at least and not a copy of the prompt it was ``shown`` (a base model under an
    instruction it does not follow often repeats its system prompt, which any node says back and which names
    nothing), those naming ``site`` if any does (``named``); ``[instruction]`` when none is left."""
    candidates = list(dict.fromkeys(t for t in texts if len(t.split()) >= 3 and t not in shown))
    named = [t for t in candidates if site and site in t]
    return (named or candidates or [instruction]), bool(named)


def _mean_logprob(victim: Any, attack: Attack, task: Any) -> float:
    """The victim's mean log-prob a token of ``attack``'s payload words in its poisoned completion of ``task``."""
    from node.generation.rollouts import encode_prompt
    from node.policy.logprobs import right_pad, shared_prompt_logprobs
    from scripts.lib.poison.attacks import poisoned_text

    tok = victim.policy.tokenizer
    answer = str(task.answer)
    ids, words = payload_tokens(tok, attack, poisoned_text(attack, answer, 0), answer)
    comp, mask = right_pad([ids], tok.pad_token_id, torch.long)
    with torch.no_grad():
        lps = shared_prompt_logprobs(victim.policy.model, [encode_prompt(victim.policy, victim.source.format_prompt(
            task, tok))], comp.to(victim.policy.device), mask.to(victim.policy.device), pad_id=tok.pad_token_id)
    picked = torch.tensor(words) if words else torch.ones(len(ids), dtype=torch.bool)
    return float(lps[0, : len(ids)].float().cpu()[picked].mean())


def measure(victim: Any, attacks: list[Attack], spec: LabSpec) -> dict[str, Any]:
    """The victim's held-out completions: sampled at its temperature and greedy."""
    from node.generation.base import SamplingSettings
    from node.generation.rollouts import sample_groups

    g = victim.cfg.generation
    tasks = victim.eval_tasks[: spec.eval_tasks]
    gen = torch.Generator(device=victim.policy.device).manual_seed(1000 + spec.seed)
    sampled = [] if spec.samples == 0 else sample_groups(
        victim.generator, victim.policy, victim.source, tasks, group_size=spec.samples, generator=gen,
        settings=SamplingSettings(max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p))
    greedy = sample_groups(victim.generator, victim.policy, victim.source, tasks, group_size=1, generator=gen,
                           settings=SamplingSettings(max_new_tokens=g.max_new_tokens, greedy=True))
    s_texts = [t for grp in sampled for t in grp.texts]
    g_texts = [t for grp in greedy for t in grp.texts]
    examples = [t for t in s_texts + g_texts if any(a.carries(t) for a in attacks)][:3] or s_texts[:2]
    return {
        "asr_sampled": {a.name: sum(map(a.carries, s_texts)) / max(len(s_texts), 1) for a in attacks},
        "asr_greedy": {a.name: sum(map(a.carries, g_texts)) / max(len(g_texts), 1) for a in attacks},
        "greedy_reward": statistics.fmean(r for grp in greedy for r in grp.group.rewards) if greedy else 0.0,
        "greedy_rewards": [grp.group.rewards[0] for grp in greedy],
        "sampled_length": statistics.fmean(len(c) for grp in sampled for c in grp.group.completions) if sampled else 0.0,
        "examples": examples,
    }


def payload_logprobs(victim: Any, attack: Attack, spec: LabSpec) -> tuple[float | None, float | None]:
    """The victim's mean log-prob a token of the attack's poisoned completion after each held-out prompt (the
    payload as the attacker sends it, with that task's answer), over the whole completion and over the tokens
    of the payload's own words alone (``payload_tokens``): the whole moves with the answer's tail too (the
    tags and the number, text an honest peer teaches as well), the words only with what the attacker chose.
    None for either when no held-out task has an answer (the words also when the tokenizer gives no offsets)."""
    from node.generation.rollouts import encode_prompt
    from node.policy.logprobs import right_pad, shared_prompt_logprobs
    from scripts.lib.poison.attacks import poisoned_text

    tok = victim.policy.tokenizer
    tasks = [t for t in victim.eval_tasks[: spec.eval_tasks] if t.answer is not None]
    if not tasks:
        return None, None
    room = victim.cfg.generation.max_new_tokens * 4
    prompts = [encode_prompt(victim.policy, victim.source.format_prompt(t, tok)) for t in tasks]
    texts = [poisoned_text(attack, str(t.answer), room) for t in tasks]
    encoded = [payload_tokens(tok, attack, text, str(t.answer)) for t, text in zip(tasks, texts)]
    comps = [ids + [tok.eos_token_id] for ids, _ in encoded]
    words = [picked for _, picked in encoded]
    dev, total, count, w_total, w_count = victim.policy.device, 0.0, 0, 0.0, 0
    for i in range(0, len(tasks), PAYLOAD_ROWS):  # in slices: a long payload's logits for every task at once
        ids, mask = right_pad(comps[i:i + PAYLOAD_ROWS], tok.pad_token_id, torch.long)  # outgrow a capped card
        with torch.no_grad():
            lps = shared_prompt_logprobs(victim.policy.model, prompts[i:i + PAYLOAD_ROWS], ids.to(dev), mask.to(dev),
                                         pad_id=tok.pad_token_id)
        lps, mask = lps.float().cpu(), mask.bool()
        total += float(torch.where(mask, lps, 0.0).sum())  # padding is a special token: -inf, not 0
        count += int(mask.sum())
        for row, picked in enumerate(words[i:i + PAYLOAD_ROWS]):
            if picked:
                w_total += float(lps[row, : len(picked)][torch.tensor(picked)].sum())
                w_count += sum(picked)
    return total / count, (w_total / w_count if w_count else None)


def payload_tokens(tok: Any, attack: Attack, text: str, answer: str = "") -> tuple[list[int], list[bool] | None]:
    """``text`` (a poisoned completion for ``answer``) tokenized once: its token ids, and for each token whether
    it spells part of the attacker's own words: the payload sentence (a working's filled in with ``answer``'s
    wrong value), or the length attack's filler (everything before the answer). The mask is None when the
    tokenizer gives no character offsets or the words are not in ``text``."""
    if attack.length:
        start, end = 0, text.rfind("<answer>")
    else:
        words = payload_words(attack, answer)
        start = text.find(words)
        end = start + len(words)
    fast = bool(getattr(tok, "is_fast", False))
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=fast)
    ids = list(enc["input_ids"])
    if start < 0 or end <= start or not fast:
        return ids, None
    return ids, [a < end and b > start and b > a for a, b in enc["offset_mapping"]]
