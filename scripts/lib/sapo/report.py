"""``bench_sapo.py``'s report: each arm's reward against its baseline with a 95% interval over paired seeds,
the table (plain or markdown), the cost line, the end-of-run figures and the goals met or missed."""

from __future__ import annotations

import math
import statistics
from typing import Any

from scripts.lib.sapo.runs import (
    ARMS,
    BASELINE_OF,
    LEVER_ARMS,
    SETTINGS,
    SILO_OF,
    VARIANT_OF,
    is_remix,
    parse_split,
    silo_split,
)

MAIN_ARM = "topr_corrected"
HOMOGENEOUS_TOLERANCE = -2.0  # goal "within": corrected sharing within 2% of silo
WEAK_GAIN, TYPE_TOLERANCE = 30.0, -2.0  # goal "weak_gain": weaker nodes +30%, no node type below -2%
SWARM_GAIN = 20.0  # goal "gain": +20% at some sharing split
REMIX_GAIN = 5.0  # ReMix at least +5% reward over LoRA at equal active rank

# Two-sided 95% quantiles of Student's t by degrees of freedom (1.96 beyond the table).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def cum_reward(rewards: list[float]) -> float:
    return statistics.fmean(rewards)  # the area under the sampled-reward curve, per step


def _end(rewards: list[float]) -> float:
    """Sampled reward over the last quarter of the run: where the policy got to, not the area under it."""
    return statistics.fmean(rewards[-max(1, len(rewards) // 4) :])


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its two-sided 95% t-interval (0 for a single value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    df = len(values) - 1
    t = next((_T95[k] for k in sorted(_T95) if k >= df), 1.96)
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def _by_type(res: dict[str, Any], metric: str) -> dict[str, float]:
    """``metric`` ("cum", "end": the last quarter's sampled reward, "acc", "signal") averaged over the nodes
    of each type, and over all ("all")."""
    per_node = {"cum": [cum_reward(r) for r in res["rewards"]], "end": [_end(r) for r in res["rewards"]],
                "acc": res["accuracy"], "signal": [statistics.fmean(s) for s in res["signal"]]}[metric]
    out: dict[str, list[float]] = {"all": list(per_node)}
    for kind, value in zip(res["node_types"], per_node):
        out.setdefault(kind, []).append(value)
    return {k: statistics.fmean(v) for k, v in out.items()}


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (setting, arm, split): means over seeds and paired changes against the silo."""
    index = {(r["spec"]["setting"], r["spec"]["arm"], r["spec"]["split"], r["spec"]["seed_index"]): r
             for r in results}
    keys = sorted({k[:3] for k in index}, key=_row_order)
    rows = []
    for setting, arm, split in keys:
        runs = [index[k] for k in sorted(index) if k[:3] == (setting, arm, split)]
        types = list(dict.fromkeys(runs[0]["node_types"]))
        row: dict[str, Any] = {"setting": setting, "arm": arm, "split": split, "seeds": len(runs),
                               "nodes": runs[0]["spec"]["nodes"], "steps": runs[0]["spec"]["steps"], "types": types}
        for metric in ("cum", "end", "acc", "signal"):
            values = [_by_type(r, metric) for r in runs]
            row[metric] = {t: mean_ci([v[t] for v in values]) for t in ["all", *types]}
        row["peer_groups"] = statistics.fmean(statistics.fmean(p) for r in runs for p in r["peer_groups"])
        timed = [r["cpu_seconds"] for r in runs if "cpu_seconds" in r]
        row["cpu_seconds"] = statistics.fmean(timed) if timed else None
        row["cost"] = {k: statistics.fmean(r["cost_per_node_step"][k] for r in runs)
                       for k in runs[0]["cost_per_node_step"]}
        row["rejected"] = {k: sum(r["rejected"].get(k, 0) for r in runs) for r in runs for k in r["rejected"]}
        kept = [r for r in runs if "screen_pauses" in r]  # runs saved before the pauses were kept say nothing
        row["screen_pauses"] = sum(len(r["screen_pauses"]) for r in kept) if kept else None
        if arm in BASELINE_OF:
            base_split = silo_split(split) if arm in SILO_OF else split
            pairs = [(r, s) for r in runs
                     if (s := index.get((setting, BASELINE_OF[arm], base_split, r["spec"]["seed_index"]))) is not None]
            row["paired_seeds"] = len(pairs)
            for metric in ("cum", "end", "acc"):
                row[f"d_{metric}"] = {
                    t: mean_ci([100 * (_by_type(r, metric)[t] / _by_type(s, metric)[t] - 1) for r, s in pairs])
                    if pairs and all(_by_type(s, metric)[t] > 0 for _, s in pairs) else None
                    for t in ["all", *types]}
        rows.append(row)
    return rows


def _row_order(key: tuple[str, str, str]) -> tuple[int, int, int, int]:
    setting, arm, split = key
    local, external, on_top = parse_split(split)
    return (list(SETTINGS).index(setting), list(ARMS).index(arm), int(on_top), -local if not on_top else external)


# ----------------------------------------------------------------------------------------------- output


def _pct(value: tuple[float, float] | None) -> str:
    if value is None:
        return "n/a"
    mean, half = value
    return f"{mean:+.1f}% ±{half:.1f}" if half else f"{mean:+.1f}%"


def table_lines(rows: list[dict[str, Any]], markdown: bool = False) -> list[str]:
    """Per setting: cumulative reward (all nodes and by node type) and final accuracy, vs the paired silo."""
    lines: list[str] = []
    for setting in dict.fromkeys(r["setting"] for r in rows):
        part = [r for r in rows if r["setting"] == setting]
        types = part[0]["types"]
        head = ["arm", "split", "seeds", "cum reward", "vs silo", *(f"{t} vs silo" for t in types if len(types) > 1),
                "accuracy", "vs silo", "own signal", "peer groups", "step s", "CPU-s a run"]
        body = []
        for r in part:
            silo = r["arm"] not in BASELINE_OF
            cum = f"{r['cum']['all'][0]:.3f}"
            n_seeds = str(r["seeds"]) if silo else f"{r['paired_seeds']} paired"
            body.append([r["arm"], r["split"], n_seeds, cum, "baseline" if silo else _pct(r["d_cum"]["all"]),
                         *((f"{r['cum'][t][0]:.3f}" if silo else _pct(r["d_cum"][t])) for t in types if len(types) > 1),
                         f"{r['acc']['all'][0]:.3f}", "baseline" if silo else _pct(r["d_acc"]["all"]),
                         f"{r['signal']['all'][0]:.2f}", f"{r['peer_groups']:.2f}", f"{r['cost']['step_seconds']:.2f}",
                         "-" if r.get("cpu_seconds") is None else f"{r['cpu_seconds']:.0f}"])
        seeds = max(r["seeds"] for r in part)
        nodes = part[0]["nodes"]
        title = f"{setting} ({SETTINGS[setting].description}; {nodes} nodes, {seeds} seed(s))"
        if markdown:
            lines += [f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
            lines += ["| " + " | ".join(cells) + " |" for cells in body]
        else:
            widths = [max(len(str(c)) for c in col) for col in zip(head, *body)]
            lines += [title, "  ".join(h.ljust(w) for h, w in zip(head, widths))]
            lines += ["  ".join(str(c).ljust(w) for c, w in zip(cells, widths)) for cells in body]
        lines.append("")
    return lines


def cost_line(rows: list[dict[str, Any]]) -> str | None:
    """The exchange's per-step cost, averaged over every sharing row."""
    sharing = [r for r in rows if r["arm"] in SILO_OF]
    if not sharing:
        return None
    c = {k: statistics.fmean(r["cost"][k] for r in sharing) for k in sharing[0]["cost"]}
    ms = {k: 1000 * v for k, v in c.items()}
    return (f"exchange per node step: {ms['exchange_seconds']:.1f} ms of a {ms['step_seconds']:.0f} ms step "
            f"({100 * c['exchange_seconds'] / c['step_seconds']:.1f}%): encode+sign {ms['wire_encode_seconds']:.2f} ms, "
            f"manifest+screen+decode+verify {ms['wire_verify_seconds']:.2f} ms, ingest (regenerate, re-score, "
            f"anchors) {ms['ingest_seconds']:.2f} ms, the rest building records and selecting")


def end_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per sharing row: the last quarter's sampled reward against the silo's, by node type (how far the
    policies got, where the cumulative figure averages over the whole run)."""
    lines = []
    for r in rows:
        if r["arm"] in BASELINE_OF and r.get("d_end"):
            types = ["all", *r["types"]] if len(r["types"]) > 1 else ["all"]
            lines.append(f"last quarter vs {BASELINE_OF[r['arm']]}, {r['setting']} {r['arm']} {r['split']}: "
                         + ", ".join(f"{t} {_pct(r['d_end'][t])}" for t in types))
    return lines


def pause_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per sharing row: how often one node's peer-text screen paused another (every node of a run is honest;
    a pause is no offence, but the issue's goal for nodes at one stage is none); rows whose runs did not keep the
    pauses say nothing."""
    return [f"honest peers paused by the screen, {r['setting']} {r['arm']} {r['split']}: {r['screen_pauses']}"
            f" (same-stage goal: 0)" for r in rows if r["arm"] in BASELINE_OF and r.get("screen_pauses") is not None]


def goals(rows: list[dict[str, Any]]) -> list[str]:
    """The issues' goals, checked on the rows present: per setting, its goal (``Setting.goal``) for TOPR
    corrected (on-policy GRPO shown alongside); ReMix against LoRA wherever it ran."""
    lines = []
    for setting in dict.fromkeys(r["setting"] for r in rows):
        goal = SETTINGS[setting].goal
        for arm in ("topr_corrected", *LEVER_ARMS, "grpo_onpolicy"):
            shared = [r for r in rows if r["setting"] == setting and r["arm"] == arm and r["d_cum"]["all"]]
            silo = next((r for r in rows if r["setting"] == setting and r["arm"] == SILO_OF[arm]), None)
            if goal is None or not shared or silo is None:
                continue
            if goal == "within":
                ok = all(r["d_cum"]["all"][0] >= HOMOGENEOUS_TOLERANCE for r in shared)
                deltas = ", ".join(f"{r['split']} {_pct(r['d_cum']['all'])}" for r in shared)
                lines.append(f"goal {setting}, {arm} within 2% of silo at every split: {'MET' if ok else 'NOT MET'}"
                             f" -- {deltas}")
            elif goal == "gain":
                met = [r["split"] for r in shared if r["d_cum"]["all"][0] >= SWARM_GAIN]
                deltas = ", ".join(f"{r['split']} {_pct(r['d_cum']['all'])}" for r in shared)
                lines.append(f"goal {setting}, {arm} >= +{SWARM_GAIN:.0f}% at some split: "
                             f"{'MET at ' + ', '.join(met) if met else 'NOT MET'} -- {deltas}")
            else:  # weak_gain
                weak = min(silo["types"], key=lambda t: silo["cum"][t][0])
                met = [r["split"] for r in shared if r["d_cum"][weak] and r["d_cum"][weak][0] >= WEAK_GAIN
                       and all(r["d_cum"][t] and r["d_cum"][t][0] >= TYPE_TOLERANCE for t in r["types"])]
                deltas = "; ".join(f"{r['split']} " + ", ".join(f"{t} {_pct(r['d_cum'][t])}" for t in r["types"])
                                   for r in shared)
                lines.append(f"goal {setting}, {arm}: weaker nodes ({weak}) >= +30% and no type below -2%: "
                             f"{'MET at ' + ', '.join(met) if met else 'NOT MET'} -- {deltas}")
        for r in rows:
            if r["setting"] == setting and is_remix(r["arm"]) and r["d_cum"]["all"]:
                base = next(b for b in rows if (b["setting"], b["arm"], b["split"]) == (setting, VARIANT_OF[r["arm"]],
                                                                                          r["split"]))
                ok = r["d_cum"]["all"][0] >= REMIX_GAIN
                against = "LoRA" if base["arm"] == "silo" else f"LoRA ({base['arm']})"
                lines.append(f"goal {setting}, {r['arm']} >= +{REMIX_GAIN:.0f}% reward over {against} at {r['split']}: "
                             f"{'MET' if ok else 'NOT MET'} -- reward {_pct(r['d_cum']['all'])}, accuracy "
                             f"{_pct(r['d_acc']['all'])}, step time {r['cost']['step_seconds']:.2f} s against "
                             f"{base['cost']['step_seconds']:.2f} s")
    return lines
