"""``metrics.jsonl`` over a long run: compacted past ``tracking.metrics_max_mb`` so it stays bounded, with
the newest rows whole and the older ones thinned at a uniform stride, evaluation rows at their own."""

from __future__ import annotations

import json

from node.api.metrics import MetricsWriter, compact_rows, read_metrics


def _row(step: int) -> dict:
    row = {"step": step, "time": 1.0 * step, "reward_mean": 0.5, "loss": 0.1, "pad": "x" * 60}
    if step % 25 == 0:
        row["eval_accuracy"] = 0.75
    return row


def _size(lines: list[str]) -> int:
    return sum(len(x) + 1 for x in lines)


def test_compaction_keeps_recent_rows_whole_and_thins_the_older_ones_at_a_uniform_stride():
    lines = [json.dumps(_row(s)) for s in range(1, 201)]
    recent, older = _size(lines[-20:]), _size(lines) // 4
    kept = compact_rows(lines, recent, older, eval_every=25)
    steps = [json.loads(x)["step"] for x in kept]
    assert steps[-20:] == list(range(181, 201))  # the newest rows as written
    assert steps[0] == 1 and _size(kept) <= recent + older
    thinned = [s for s in steps[1:-20] if s % 25]
    stride = thinned[1] - thinned[0]
    assert stride in (2, 4, 8) and all(s % stride == 0 for s in thinned)  # every stride-th step
    assert thinned == [s for s in range(stride, 181, stride) if s % 25]
    assert {s for s in steps[1:-20] if s % 25 == 0} == {25, 50, 75, 100, 125, 150, 175}  # evaluations fit whole


def test_the_file_stays_under_its_bound_for_any_length_of_run(tmp_path):
    path = tmp_path / "metrics.jsonl"
    bound = 20_000
    writer = MetricsWriter(path, max_bytes=bound, eval_every=25)
    sizes = []
    for step in range(1, 5001):
        writer.write(_row(step))
        sizes.append(path.stat().st_size)
    writer.close()
    steps = [r["step"] for r in read_metrics(path)]
    assert writer.compactions > 10 and max(sizes) <= bound + len(json.dumps(_row(5000))) + 1
    assert steps == sorted(steps) and steps[0] == 1 and steps[-1] == 5000
    assert steps[-50:] == list(range(4951, 5001))  # the recent past whole
    early = [s for s in steps if s <= 2500 and s % 25]  # the first half of the run is still there, evenly
    gaps = {b - a for a, b in zip(early, early[1:])}
    assert len(early) >= 10 and len(gaps) <= 2, gaps  # one stride (two where a multiple of 25 sits between)
    assert len([s for s in steps if s % 25 == 0 and s <= 2500]) >= 2  # and some of its evaluations


def test_a_resumed_run_keeps_compacting_the_same_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path, max_bytes=5_000)
    for step in range(1, 201):
        writer.write(_row(step))
    writer.close()
    writer = MetricsWriter(path, resume_step=150, max_bytes=5_000)  # steps after the checkpoint are redone
    for step in range(151, 301):
        writer.write(_row(step))
    writer.close()
    steps = [r["step"] for r in read_metrics(path)]
    assert steps == sorted(set(steps)) and steps[-1] == 300 and path.stat().st_size <= 5_000
