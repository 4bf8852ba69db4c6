"""``train``, ``sapo`` and ``ingest``: the optimizer and loss, what a step trains on, and the budgets of
peers' rollouts taken in."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from node.config.section import Section
from node.modes import (
    AdvantageKind,
    DatasetPreference,
    LossDenominator,
    LossKind,
    PeerFilter,
    PeerSlots,
    SelectionPolicy,
    TakePeers,
)

AUTO_MICRO_BATCH = {"cpu": 16, "gpu": 256}
"""``train.micro_batch_size: auto``: rows a pass at most, by device kind."""
AUTO_LOGITS_MB_CPU = 1024
AUTO_LOGITS_GPU_SHARE = 16
"""``train.logits_memory_mb: auto`` on a GPU: this fraction of its memory (5,097 MB on an 80 GB H100)."""


class TrainConfig(Section):
    steps: int | None = Field(None, ge=0, description="steps to train; None (the default): until stopped (Ctrl-C, "
                              "SIGTERM), as a daemon does")
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    loss: LossKind = "topr"
    advantage: AdvantageKind = "rloo"
    length_norm: bool = False
    eps_low: float = Field(0.2, ge=0)
    eps_high: float = Field(0.28, ge=0)
    external_shift: float = Field(0.0, ge=0, description="AsymRE baseline shift for external groups")
    off_policy_correction: bool = Field(
        True, description="use behaviour log-probs (ratios, tapers); false treats all data as on-policy (ratio 1)"
    )
    engine_is_cap: float | None = Field(
        None, gt=1, description="correct the generation engine's mismatch with the trainer on the node's own "
        "samples: per-token importance weights min(trainer/engine, cap), e.g. 2 for a bfloat16 vLLM engine; "
        "null: off (the TOPR taper and REC clip then absorb the gap)")
    optimizer_steps: int = Field(1, ge=1, description="optimizer steps a training step: its sequences dealt "
                                 "round-robin into this many parts, one update each (the later parts are off-policy "
                                 "by the earlier updates, which the TOPR taper and REC clip correct)")
    loss_denominator: LossDenominator = Field(
        "batch", description="batch: an update's loss is the mean over its sequences (every step the same size); "
        "fixed: their sum over sapo.local_groups x generation.group_size sequences, so peer groups on top and "
        "steps with more groups with signal make larger steps")
    micro_batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        256, description="rows of a forward/backward pass, at most (a sequence is one row; with ReMix, one a "
        f"routing); auto: {AUTO_MICRO_BATCH['cpu']} on the CPU, {AUTO_MICRO_BATCH['gpu']} on a GPU (where a step "
        "is launch-bound, fewer passes are faster: docs/results/gpu-h100.md), the logits budget bounding both")
    logits_memory_mb: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto", description="logits memory of one forward/backward micro-batch (rows x completion length x "
        "vocabulary x 12 bytes): fewer rows when a large vocabulary would exceed it; auto: "
        f"{AUTO_LOGITS_MB_CPU} on the CPU, 1/{AUTO_LOGITS_GPU_SHARE} of a GPU's memory (at least "
        f"{AUTO_LOGITS_MB_CPU})")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward (less GPU memory)")
    fused: bool = Field(True, description="train a plain-LoRA policy of a family node.policy.families marks "
                        "fused (Llama, Mistral without a sliding window, Qwen2, Qwen3) through the fused pass "
                        "(node.fused.decoder: projections by family, one optimizer tensor, a step's figures read "
                        "once): the same losses and gradients in a seventh of the operations; false: through "
                        "transformers' and peft's modules (ReMix, gradient checkpointing and other families "
                        "always are)")
    checkpoint_every: int = Field(25, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    keep_every: int | None = Field(None, ge=1, description="also keep every checkpoint whose step is a multiple of "
                                   "this (milestones, never pruned; a checkpoint is written at each)")
    eval_every: int | None = Field(
        25, ge=0, description="steps between held-out evaluations (greedy, on tasks.eval_size tasks), and one at "
        "the last step of a run with train.steps; 0 or null: no evaluation at all, neither periodic nor final")

    def micro_batch_rows(self, device_type: str) -> int:
        """``micro_batch_size`` on a device of this kind (``cpu``, ``cuda``, ...)."""
        if self.micro_batch_size != "auto":
            return self.micro_batch_size
        return AUTO_MICRO_BATCH["cpu" if device_type == "cpu" else "gpu"]

    def logits_budget_mb(self, device_type: str, device_memory_mb: int | None) -> int:
        """``logits_memory_mb`` on a device of this kind holding ``device_memory_mb`` (None: not known)."""
        if self.logits_memory_mb != "auto":
            return self.logits_memory_mb
        if device_type == "cpu" or not device_memory_mb:
            return AUTO_LOGITS_MB_CPU
        return max(AUTO_LOGITS_MB_CPU, device_memory_mb // AUTO_LOGITS_GPU_SHARE)


class SapoConfig(Section):
    local_groups: int = Field(32, ge=1, description="I: local task groups a step")
    external_groups: int = Field(0, ge=0, description="J: external groups a step")
    generated_groups: int | None = Field(
        None, ge=1, description="groups generated (and shared) a step; default I. Train uses I of them"
    )
    selection: SelectionPolicy = "uniform"
    max_per_peer: int | None = Field(None, ge=1)
    staleness_epochs: int = Field(2, ge=0)
    dataset_preference: DatasetPreference = Field(
        "none", description="weight peer groups by dataset: own_mixture (the node's task weights), low_signal "
        "(1 - the node's own recent signal rate on the dataset), both (the product), learning_band (1 where the "
        "node's own recent mean reward is within [band_low, band_high], preference_floor outside), none")
    peer_filter: PeerFilter = Field(
        "none", description="above_own: train only on peer groups whose re-scored mean reward is above the "
        "node's own mean reward on their dataset over the last signal_window steps (a peer that does better than "
        "we do there); none: any peer group with signal")
    signal_window: int = Field(8, ge=1, description="steps of the node's own groups behind its signal and "
                               "success rates")
    preference_floor: float = Field(
        0.1, ge=0, le=1, description="low_signal: lowest weight of a dataset the node has signal on; "
        "learning_band: the weight of a dataset outside the band")
    band_low: float = Field(0.05, ge=0, le=1, description="learning_band: the lowest own success rate (mean "
                            "reward over signal_window steps) of a dataset inside the band")
    band_high: float = Field(0.95, ge=0, le=1, description="learning_band: the highest own success rate of a "
                             "dataset inside the band")
    peer_slots: PeerSlots = Field(
        "fixed", description="fixed: up to J peer groups a step; flat: peer groups only in the slots of the "
        "step's own flat groups (no signal), at most J, so a step never trains on more groups than it generated")
    take_peers: TakePeers = Field(
        "always", description="decide: decline peer groups while their gradient is shown not to agree with the "
        "node's own (the decide_* keys); always: every step")
    decide_window: int = Field(64, ge=2, description="decide: the alignments (own vs peer gradient cosine) "
                               "the estimate averages")
    decide_warmup: int = Field(4, ge=1, description="decide: alignments measured, peers taken, before deciding")
    decide_probe_every: int = Field(8, ge=1, description="decide: while declining, every this many steps "
                                    "takes peer groups anyway to keep measuring")
    decide_min_alignment: float = Field(0.0, ge=-1, lt=1, description="decide: peers are declined once the "
                                        "window's mean alignment plus one standard error is at or below this")

    @model_validator(mode="after")
    def _band_in_order(self) -> SapoConfig:
        if self.band_low > self.band_high:
            raise ValueError(f"sapo.band_low ({self.band_low:g}) is above sapo.band_high ({self.band_high:g}); "
                             "swap them")
        return self


class IngestConfig(Section):
    """Budgets of the ingestion of peers' rollouts, per step (see ``node.exchange.ingest``)."""

    max_groups_per_step: int = Field(64, ge=0, description="at most this many (and what the pool can use)")
    max_groups_per_peer_step: int = Field(16, ge=1)
    max_rollouts_per_step: int = Field(1024, ge=1)
    max_tokens_per_step: int = Field(256 * 1024, ge=1)
    max_seconds_per_step: float = Field(5.0, gt=0, description="wall time of ingestion and scoring a step")
    max_seconds_per_peer_step: float = Field(2.0, gt=0)
    max_seeds_per_peer_epoch: int = Field(2, ge=1, description="distinct task seeds of one peer per epoch")
    score_timeout: float = Field(2.0, gt=0, description="per completion, for sources scored in a child process")
    min_logprob: float = Field(-100.0, lt=0, description="lowest behaviour log-prob accepted from a peer")
    anchor_memory_mb: int = Field(256, ge=1, description="logits memory of one re-tokenization micro-batch")
    # What a peer's text may teach (node/exchange/plausibility.py; docs/trust.md, "Peer text").
    screen: bool = Field(True, description="read every peer completion with this node's own model and keep what "
                         "it could not have said out of training (the token floor, the span and length bounds)")
    screen_token_floor: float = Field(
        -9.2, lt=0, description="a peer token this node's model gives a log-prob below this (-9.2: 1e-4) is not "
        "trained on: peers can only reinforce tokens the node might sample itself")
    screen_positive_floor: float | None = Field(
        -2.3, lt=0, description="a peer token in a completion the loss pushes up counts fully when this node's model "
        "gives it at least this log-prob (-2.3: 0.1), below it in proportion to its probability: a peer can only "
        "teach at full speed what the node already says (null: every token counts fully). -1.2 (0.3) kept 59% of a "
        "weak smollm2 node's gain from strong peers on seed 1, -2.3 91%; both held all nine attacks on six seeds, "
        "but at -2.3 the length filler's words, text the node finds likely, no longer fell in mean "
        "(docs/results/poison.md), and 100-step on-top sharing gained 2 to 4 points less on each of four paths "
        "(docs/results/poison-working-answer.md)")
    screen_answer_full: bool = Field(
        True, description="the tokens of a peer completion's final answer count fully (no token floor, no "
        "weight) when that answer is the task's reference verbatim: the verifier has read them and the task, "
        "not the peer, chose them (smollm2, 100 steps: sharing +17.0% and +9.3% over the silo with it, +14.5% "
        "and +6.5% without; every attack held: docs/results/poison.md)")
    screen_answer_working: bool = Field(
        True, description="with screen_answer_full, the answer where the working states it right before the tag "
        "(\"7 + 8 = 15.\" then <answer>15</answer>) counts fully too: the reference again, the result a peer "
        "that has learned a step gets right where this node would not, and most of what the weight holds back "
        "of honest text (smollm2, 100 steps: sharing +13.6% over the silo on seed 1 with it, +8.1% without, "
        "+16.1% on seed 0 against +14.3%; all nine attacks still held on two seeds, each payload's own words down: "
        "docs/results/poison-working-answer.md)")
    screen_window: int = Field(6, ge=1, description="tokens of the span whose mean log-prob is a completion's "
                               "least plausible stretch (an injected sentence is a run of unlikely tokens)")
    screen_span_quantile: float | None = Field(
        0.01, gt=0, lt=1, description="a peer completion whose least plausible span is below this quantile of "
        "the node's own completions' (less screen_span_margin) is dropped: about this share of an honest peer's "
        "that samples as the node does (null: no span bound)")
    screen_span_margin: float = Field(1.0, ge=0, description="nats below the own quantile before a peer's span "
                                      "counts as implausible")
    screen_span_all: bool = Field(
        False, description="hold every peer completion to the span bound, not only those the loss pushes up "
        "(advantage above 0): a completion pushed down cannot teach the node its text, and between honest nodes "
        "at different stages holding every one dropped 4.2% of the peers' completions instead of 1.3% (smollm2, "
        "seed 1). Holding only the pushed-up ones is safe with screen_share_dropped: without it, a smollm2 victim "
        "of three attacker identities stopped answering (held-out greedy 0.002 against its silo's 0.521; with "
        "it 0.546; docs/results/poison-share-dropped.md)")
    screen_share_dropped: bool = Field(
        True, description="a peer completion the span bound drops takes its advantage out of its group: the "
        "group's kept completions take it up (screen_share_to; none changing sign), so a group whose pushed-up "
        "completions were dropped does not train its pushed-down ones alone, which pushes the node away from "
        "what they share with its own answers (their format); false: the dropped advantage is lost")
    screen_share_to: Literal["other_sign", "kept"] = Field(
        "other_sign", description="which kept completions of the group take a dropped completion's advantage up: "
        "other_sign, those of the other sign, each toward 0 in proportion to its own (a dropped positive's by the "
        "negatives), so the group's kept positives are pushed up no harder than before; kept, every kept one "
        "equally, so kept completions of the dropped one's sign gain (a smollm2 victim of the echo attack: the "
        "payload's log-prob rose 0.59 nats a token with kept, 0.25 with other_sign; false drops between honest "
        "nodes 1.6% with other_sign; docs/results/poison-share-dropped.md)")
    screen_length_quantile: float = Field(0.95, gt=0, le=1, description="the own completion length (per dataset) "
                                          "the length bound scales")
    screen_length_ratio: float = Field(2.0, ge=1, description="a peer completion longer than this times the own "
                                       "quantile length of its dataset is dropped (needlessly long text)")
    screen_length_all: bool = Field(
        False, description="hold every peer completion to the length bound, not only those the loss pushes up "
        "(reward above their group's mean): a long completion pushed down cannot make the node verbose, and "
        "between honest nodes at different stages most long ones are a weaker peer's, truncated and wrong "
        "(always on with train.external_shift > 0, where one below the mean can be pushed up)")
    screen_min_own: int = Field(64, ge=1, description="own completions seen (of the dataset, for length) before "
                                "the span and length bounds apply")
    screen_reference: Literal["base", "policy", "both"] = Field(
        "both", description="which model reads peer text for the token floor, the weight, the span and sequence "
        "bounds: base, the frozen base (the adapters off: a forward pass a step over the peer completions the loss "
        "pushes up), so that a payload the node was trained toward is not judged by the model it moved, but text the "
        "base writes and the trained node no longer does passes (docs/trust.md); policy, the training pass's own "
        "log-probs (no pass of its own), whose bar rises with every step trained on a payload; both, the base's "
        "reads and each token at the lower of the base's and the policy's log-prob (own completions too, for the "
        "profile), so text fails if either would not say it, at the base's cost: the frozen base lets through text it "
        "writes that the trained node no longer does (a smollm2 victim took wrong working from an attacker and never "
        "banned it; with both, banned at step 11; docs/results/poison.md). Base and both need a LoRA policy")
    screen_profile_rows: int = Field(
        4, ge=1, description="with screen_reference=base or both: own completions a step the base reads for the profile the "
        "span and sequence bounds come from (screen_min_own of them at first, and every own completion of a dataset "
        "whose sequence floor has fewer than screen_min_own: the floor is per dataset): the profile is a low quantile over "
        "the last 1,024 read, which a few a step keep current at a fraction of a step's cost (a smollm2 row read "
        "costs about 0.15 s on two CPU cores)")
    screen_profile_every: int = Field(
        1, ge=1, description="with screen_reference=base or both: once the profile holds screen_min_own, the base reads "
        "screen_profile_rows own completions on one step of each this many and none on the others (the reads while "
        "it fills, and those of a dataset whose sequence floor is not set, every step): the profile turns over more "
        "slowly, for fewer of the base's passes. 1: in the on-top setting one step of two saved about 3 points of a "
        "step (1.12x, not the 1.10x goal) and left the sequence floor 1.4 to 1.9 nats lower after 15 steps, one of "
        "four 5 points and 2.9 nats; at two the whole suite held as at every step (docs/results/poison.md, 'The "
        "profile read on fewer steps')")
    screen_prefix_cache: bool = Field(
        True, description="with screen_reference=base or both: the base reads the prefix its prompts share (the chat "
        "template's system turn and worked example, which open every prompt of a node's tasks) once and keeps its "
        "keys and values, so each read runs only the rest of a prompt: the base does not change, so the log-probs are "
        "those of the prompt read whole, up to float rounding; in the on-top setting it took about a third off the "
        "base's reads (docs/results/poison.md, 'The base's reads with the prompts' shared prefix kept'; false: every "
        "read runs its prompts whole, the benchmark's arm)")
    screen_read_dtype: Literal["model", "bfloat16"] = Field(
        "model", description="with screen_reference=base or both: the dtype of the base's reads (the profile's own rows "
        "and the peer rows the loss pushes up). model: the policy's own dtype; bfloat16: a float32 policy reads them "
        "under bfloat16 autocast on its device (the policy's weights unchanged, no copy), faster where the processor "
        "has bfloat16 matrix units (0.75x the read time for smollm2 on a 2-core Xeon with AMX; slower on the tiny test "
        "models, whose products are too small to gain), each token's log-prob moved by 0.04 nats in mean. Off: the "
        "attack suite and the on-top pair have not been run with it (docs/results/poison.md, 'The base's reads in "
        "bfloat16')")
    screen_sequence_quantile: float | None = Field(
        0.25, gt=0, lt=1, description="a peer completion the loss pushes up weighs min(1, exp(L - F)) as a whole, L "
        "its log-prob (summed over its tokens but a verified answer's), F this quantile of the node's own "
        "completions' on the dataset: the truncated importance weight of the completion against what the node "
        "itself says, so text added to a right answer, however likely each of its words, moves the node no faster "
        "than its own less likely completions (null: off). 0.25: against five attackers that write likely text a "
        "smollm2 victim's payloads ended at most 0.07 nats a token above its silo's and every one was banned by step 8, "
        "where 0.05 left two 0.5 to 0.6 nats above it and one unbanned until step 12; 0.5 gained nothing more "
        "and failed three times as many honest completions (docs/results/poison.md)")
    screen_sequence_fail: float = Field(
        3.0, gt=0, description="a pushed-up peer completion whose log-prob is more than this many nats below the "
        "sequence floor counts as failed toward its author's pause (its weight below exp(-3), 0.05)")
    screen_group_positive_cap: float | None = Field(
        None, gt=0, description="one peer group's advantages (both signs, so it stays balanced) scaled so that its "
        "positives sum to at most this times its completions (RLOO, 8 completions: 4 right sum to 2.3, so 0.25 "
        "halves them; 1 or 7 right sum to 0.9): an attack is strong with a quarter to half of a group poisoned, weak "
        "near 8% (null: no cap)")
    screen_author_positive_cap: float | None = Field(
        None, gt=0, le=1, description="one peer author's advantages scaled so that its positives are at most this "
        "share of a step's positive advantage, the node's own included, whatever its groups (null: no cap)")
    screen_pause_share: float = Field(
        0.2, gt=0, le=1, description="an author is paused (its groups not read for screen_pause_steps) once this "
        "share of screen_pause_window completions failed among its last screen_pause_window judged (each completion judged "
        "once: dropped by the length or span bound, or pushed up with a token below screen_token_floor or a sequence "
        "weight below exp(-screen_sequence_fail)): honest peers at this node's stage fail about 0.1 to 2% (a window of 64 "
        "reaches 13 failures at a 4% rate with odds near 1e-6), one poisoned completion among four correct fails "
        "25%")
    screen_pause_window: int = Field(64, ge=1, description="an author's most recent judged completions the "
                                     "pause share is of (filled in about 8 steps by an author of two groups a step)")
    screen_pause_steps: int = Field(
        32, ge=1, description="training steps a paused author's groups are not read, twice as many at each next "
        "pause of it; then its completions are judged afresh. A pause is not an offence (the peer book does not ban "
        "for it): an honest peer at another stage of training fails the bounds this node sets from its own answers "
        "about as often as an attacker does (half of a weak node's completions at a strong one), so a pause must end "
        "(that weak node, read again after 8 steps, failed 18% at the node that had paused it: "
        "docs/results/sapo-smollm2-pair.md). Without screen_probation, each return let an attacker's text in until 13 "
        "more of its completions failed, held back but not all dropped: with 8, seed 1's sampled payload ended 1.05 "
        "nats a token above the silo's (-0.74 never let back), with 32 -0.02, and three of the other four attackers' "
        "words rose with the number of returns too (docs/results/poison.md, 'A pause instead of a ban')")
    screen_probation: int = Field(
        16, ge=0, description="an author back from a pause is on probation for its first this many completions "
        "judged: screen_pause_share of them failing (4 of 16) pauses it again for the next, doubled term, where the "
        "usual count is screen_pause_share of screen_pause_window (13 of 64): each return of the adaptive attackers "
        "let 8 of their completions in, one step's groups, rather than 16 (docs/results/poison.md, 'A probation for "
        "a returning author'); an honest peer at this node's stage (about 1% failing) reaches 4 of 16 with odds "
        "near 2e-5 (0: no probation)")
    screen_probation_first: bool = Field(
        True, description="an author first judged is on probation too: screen_pause_share of its first "
        "screen_probation completions failing pauses it, where otherwise its first pause waits for "
        "screen_pause_share of screen_pause_window (13 failures). With screen_probation_base, over the whole suite "
        "of fourteen attacks on three seeds, 53 of 54 attacker identity-runs were first paused within 10 steps "
        "(39 of 54 without the two keys), no sentence's words rose above +0.13 nats a token over the silo's in "
        "three-seed mean, the honest peer was never paused in six runs (three beside the attackers, three alone), "
        "and a 100-step sharing run of four honest nodes replayed with both would have paused none of its twelve "
        "authors (docs/results/poison.md, 'The whole suite with the new-author probation on the base's read'). "
        "Off: the first pause of an attacker whose completions fail one in four or five waits until 13 have "
        "failed; on without screen_probation_base it paused the honest peer on one run of two ('A new author on "
        "probation')")
    screen_probation_base: bool = Field(
        True, description="on probation (screen_probation), count only the failures that the frozen base's read "
        "fails too, not those of the policy's read alone (screen_reference both; the usual count takes every "
        "failure): a probation is a verdict on a few completions, and the base's read is the one a peer's text "
        "cannot move, where the policy's may read an honest peer's text lower as the node trains away from it. "
        "Every adaptive attacker but the wrong working fails the base's read (docs/results/poison.md, 'Which reader "
        "fails each attacker'); the wrong working is still paused by the usual count. Off: with "
        "screen_probation_first, on seed 0 with no attacker, counting every failure paused the honest peer (2 of "
        "its 7 failures the policy's read alone), where the base's count let it through ('The new-author "
        "probation on the base's read against the five adaptive attackers')")
    screen_probation_weight: float = Field(
        1.0, ge=0, le=1, description="the pushed-up rows of a new author, and of one on probation (screen_probation), "
        "weigh this much in the loss (its verified answer's tokens spared): what an identity sends before its "
        "first pause, which the probation makes a few steps' groups, teaches less. Off: at 0.5, over three seeds, "
        "the plausible sentence still rose +0.10 and +0.34 nats a token over sharing alone (+0.30 and +0.48 by "
        "default), and with no attacker the honest peer was paused on seed 0, its probation failed "
        "(docs/results/poison.md, 'Half weight on probation') (1: off)")
    screen_trial: int = Field(
        0, ge=0, description="a new author's rows carry no weight in the loss until this many of its completions "
        "have passed the screen: they are judged as any other's (and may pause it), so what an author sends before "
        "its first pause teaches nothing. Off: at 32, on three seeds, the sybils' and the plausible sentences' words "
        "fell to those of sharing alone (-0.02 against +0.24 and +0.28 nats a token), but with no attacker the "
        "victim, not trained toward its honest peer's text, failed 17 of its first 104 completions and paused it, "
        "and the wrong working passed its trial on one seed and was first paused at step 26, not 14 "
        "(docs/results/poison.md, 'Reruns are exact') (0: off)")

