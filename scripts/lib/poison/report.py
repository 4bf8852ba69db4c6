"""The poison lab's tables, from its saved results (``scripts/lab/poison.py``; one JSON a run).

``table``: a row a run and payload: attack success rates, the payload's log-prob before and after and after
less the silo's of the same seed (the figure: what the attack moved beyond what the victim's own training
did), held-out reward and length against the silo's, the first step each attacker identity was paused (banned, in runs before pauses), and what
the screen kept out. ``summary``: a row an attack and arm over its seeds, each seed's run one unit: the mean of
"after less the silo's" with a 95% t interval over the runs, the largest success rates, the latest first pause.
"""

from __future__ import annotations

import statistics
from typing import Any

T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}
"""Two-sided 95% Student t quantiles by degrees of freedom (runs less one; 1.96 past 10)."""


def paired(rewards: list[float], silo: list[float]) -> tuple[float, float] | None:
    """The mean of ``rewards`` less ``silo``'s, task by task (the same held-out tasks in order), in points,
    with the half-width of its 95% interval; None without two tasks in both. Pairing removes the tasks'
    own spread (an easy task is easy in both arms), so the interval is narrower than the two means' apart."""
    if len(rewards) != len(silo) or len(rewards) < 2:
        return None
    d = [100 * (a - b) for a, b in zip(rewards, silo)]
    return statistics.fmean(d), 1.96 * statistics.stdev(d) / len(d) ** 0.5


def over_runs(values: list[float]) -> tuple[float, float | None]:
    """The mean of ``values`` (one a run) and the half-width of its 95% t interval (None for one run)."""
    if len(values) < 2:
        return statistics.fmean(values), None
    return statistics.fmean(values), T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / len(values) ** 0.5


def arm_of(spec: dict[str, Any]) -> str:
    label = spec["label"]
    return label.split("-", 1)[1] if "-" in label else label


def beyond_silo(run: dict[str, Any], silo: dict[str, Any] | None, attack: str) -> float | None:
    """The payload's own words' log-prob a token after the run less the silo's after (same seed), or None."""
    if silo is None:
        return None
    after, base = run.get("payload_words_after", {}).get(attack), silo.get("payload_words_after", {}).get(attack)
    return None if after is None or base is None else after - base


def table(results: list[dict[str, Any]]) -> list[str]:
    silo = {r["spec"]["seed"]: r for r in results if r["spec"]["silo"]}
    lines = ["| attack | arm | seed | ASR sampled | ASR greedy | held-out greedy (silo; less the silo's, points) | "
             "length (silo) | payload log-prob before -> after (its words alone; words less the silo's) | "
             "first paused (step) | dropped / masked tokens (mean weight) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        sp = r["spec"]
        if sp["silo"]:
            continue
        base, v, arm = silo.get(sp["seed"]), r["victim"], arm_of(sp)
        dropped = sum(n for k, n in (v.get("ingest_rejected") or {}).items() if k in ("implausible", "too_long_for_us"))
        reward = f"{r['greedy_reward']:.3f}"
        if base:
            diff = paired(r.get("greedy_rewards", []), base.get("greedy_rewards", []))
            reward += f" ({base['greedy_reward']:.3f}" + (f"; {diff[0]:+.1f} ±{diff[1]:.1f})" if diff else ")")
        length = f"{r['sampled_length']:.1f} ({base['sampled_length']:.1f})" if base else f"{r['sampled_length']:.1f}"
        screened = f"{dropped} / {v.get('screen_tokens_masked', 0)}"
        # a screened victim's mean weight on the peer tokens its loss pushed up
        if v.get("screen_rows") and v.get("screen_positive_weight") is not None:
            screened += f" ({v['screen_positive_weight']:.2f})"
        if not r["asr_sampled"]:  # the shared arm: no attacker, no payload
            lines.append(f"| (none) | {arm} | {sp['seed']} | - | - | {reward} | {length} | - | - | {screened} |")
        for a in r["asr_sampled"]:
            paused = _first(_paused_at(r).get(a))
            # runs since 2026-12-06: when the screen first failed each identity's text (said where any failed)
            if any(step is not None for step in r.get("failed_at", {}).get(a) or []):
                paused += f" (first failed {_first(r['failed_at'][a])})"
            if r.get("published", {}).get(a) == 0:  # e.g. text after the answer: the verifier scores it 0
                lines.append(f"| {a} | {arm} | {sp['seed']} | none sent: no poisoned completion passed the "
                             f"verifier | | {reward} | {length} | - | {paused} | {screened} |")
                continue
            before, after = r["payload_before"].get(a), r["payload_after"].get(a)
            lp = f"{before:.2f} -> {after:.2f}" if before is not None and after is not None else "-"
            w_before, w_after = r.get("payload_words_before", {}).get(a), r.get("payload_words_after", {}).get(a)
            if w_before is not None and w_after is not None:  # the attacker's own words, without the answer's tail
                lp += f" (words {w_before:.2f} -> {w_after:.2f}"
                beyond = beyond_silo(r, base, a)
                lp += f"; {beyond:+.2f})" if beyond is not None else ")"
            lines.append(f"| {a} | {arm} | {sp['seed']} | {100 * r['asr_sampled'][a]:.1f}% | "
                         f"{100 * r['asr_greedy'][a]:.1f}% | {reward} | {length} | {lp} | {paused} | {screened} |")
    return lines


def summary(results: list[dict[str, Any]]) -> list[str]:
    """A row an attack and arm over its seeds (each run a unit), and one for the control sentence no one sends
    where the runs measured it (``attacks.CONTROL``: the path's own drift): the payload's words less the silo's,
    in mean with its 95% t interval over the runs; the largest sampled and greedy success rates; the latest first pause
    of an attacker identity (never: "-"); the honest peer's paused steps summed over the runs (runs saved before
    pauses: their bans)."""
    silo = {r["spec"]["seed"]: r for r in results if r["spec"]["silo"]}
    cells: dict[tuple[str, str], list[tuple[dict[str, Any], float | None]]] = {}
    for r in results:
        if r["spec"]["silo"]:
            continue
        measured = [a for a in r["asr_sampled"] if r.get("published", {}).get(a) != 0]
        if r.get("payload_words_after", {}).get("control") is not None:  # the sentence no one sends (runs since 2026-12-06)
            measured.append("control")
        for a in measured:
            cells.setdefault((a, arm_of(r["spec"])), []).append((r, beyond_silo(r, silo.get(r["spec"]["seed"]), a)))
    lines = ["| attack | arm | runs (seeds) | payload words less the silo's (nats a token, 95% over runs) | "
             "ASR sampled / greedy, largest | first paused, latest | honest peer paused (steps) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for (a, arm), runs in cells.items():
        seeds = ",".join(str(r["spec"]["seed"]) for r, _ in runs)
        values = [v for _, v in runs if v is not None]
        if values:
            mean, half = over_runs(values)
            beyond = f"{mean:+.2f}" + (f" ±{half:.2f}" if half is not None else " (one run)")
        else:
            beyond = "-"
        if a == "control":
            lines.append(f"| control (sent by no one) | {arm} | {len(runs)} ({seeds}) | {beyond} | - | - | - |")
            continue
        sampled = max(100 * r["asr_sampled"][a] for r, _ in runs)
        greedy = max(100 * r["asr_greedy"][a] for r, _ in runs)
        firsts = [s for r, _ in runs for s in _paused_at(r).get(a, [])]
        latest = "-" if not firsts else "never" if any(s is None for s in firsts) else str(max(firsts))
        honest = sum(r.get("honest_paused_steps", r.get("honest_banned_steps", 0)) for r, _ in runs)
        lines.append(f"| {a} | {arm} | {len(runs)} ({seeds}) | {beyond} | {sampled:.1f}% / {greedy:.1f}% | {latest} | "
                     f"{honest} |")
    return lines


def _paused_at(result: dict[str, Any]) -> dict[str, list[int | None]]:
    """Each attack's identities' first paused steps (a run saved before pauses: their first banned steps)."""
    return result.get("paused_at", result.get("banned_at", {}))


def _first(first: list[int | None] | None) -> str:
    """Each identity's first paused step, "never" for one that was not; "-" when not recorded."""
    if not first:
        return "-"
    return ", ".join("never" if s is None else str(s) for s in first)
