from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from node.cli import main
from protocol.identity import Identity


def test_keygen_writes_a_private_key_readable_only_by_its_owner(tmp_path, capsys):
    out = tmp_path / "id.pem"
    assert main(["keygen", "--out", str(out)]) == 0
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    ident = Identity.load(out)
    assert ident.peer_id in capsys.readouterr().out


def test_keygen_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "id.pem"
    assert main(["keygen", "--out", str(out)]) == 0
    first = Identity.load(out).peer_id
    assert main(["keygen", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert Identity.load(out).peer_id == first
    assert main(["keygen", "--out", str(out), "--force"]) == 0
    assert Identity.load(out).peer_id != first


def test_unknown_model_path_is_a_one_line_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "node.cli", "silo", "--run-dir", str(tmp_path), "--no-progress",
         f"model.name_or_path={tmp_path / 'no-such-model'}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and "model.name_or_path" in errors[0]


def test_silo_runs_a_reasoning_gym_source_end_to_end(tmp_path, small_base):
    """The reasoning-gym path (prompt formatting, answer extraction, scoring) through the real CLI, on
    small-base: reasoning-gym's prompts are longer than tiny-base's 64-token context."""
    proc = subprocess.run(
        [sys.executable, "-m", "node.cli", "silo", "-c", "configs/small-silo.yaml", "--run-dir", str(tmp_path),
         "--no-progress", "tasks.datasets=[basic_arithmetic]", "train.steps=1",
         "sapo.local_groups=2", "generation.group_size=2", "tasks.eval_size=2"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1


def test_a_locally_saved_qwen2_model_with_a_chat_template_runs(tmp_path):
    """The path a user's instruct model takes: another architecture, loaded from a folder by
    AutoModelForCausalLM/AutoTokenizer, prompts formatted with its chat template."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from node.sources.embedded.tiny import build_char_tokenizer

    folder = tmp_path / "tiny-qwen2-instruct"
    tok = build_char_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                      tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    Qwen2ForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    assert AutoTokenizer.from_pretrained(folder).chat_template
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "node.cli", "silo", "-c", "configs/qwen-reasoning-gym.yaml", "--run-dir", str(run),
         "--no-progress", f"model.name_or_path={folder}", "model.dtype=float32", "model.device=cpu",
         "model.chat_template=always", "tasks.datasets=[basic_arithmetic]", "train.steps=1", "sapo.local_groups=2",
         "sapo.external_groups=0", "generation.group_size=2", "generation.max_new_tokens=4", "tasks.eval_size=2"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run / "metrics.jsonl").read_text().count("\n") == 1


def test_task_and_prompt_mistakes_are_one_line_errors(tmp_path, capsys):
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _check_task_mistakes(tmp_path, capsys)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _check_task_mistakes(tmp_path, capsys):
    assert main(["silo", "--run-dir", str(tmp_path / "a"), "--no-progress", "tasks.datasets=[nope]"]) == 2
    assert "tasks:" in capsys.readouterr().err
    rc = main(["silo", "--run-dir", str(tmp_path / "new" / "b"), "--no-progress", "tasks.source=reasoning_gym",
               "tasks.datasets=[basic_arithmetic]", "model.chat_template=always", "tasks.eval_size=2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "model.chat_template" in err[-1]
    assert not (tmp_path / "new").exists()  # the failed invocation left no run dir (nor the parent it made)
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    assert main(["silo", "--run-dir", str(kept), "--no-progress", "tasks.source=reasoning_gym",
                 "tasks.datasets=[basic_arithmetic]", "model.chat_template=always", "tasks.eval_size=2"]) == 2
    assert (kept / "notes.txt").read_text() == "mine"  # a run dir that was there before is left alone


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("swarm-node: error: ")
    return lines[0]


def test_an_unwritable_run_dir_is_a_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["silo", "--run-dir", str(blocker / "run"), "--no-progress"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "run_dir" in line and "not writable" in line and "--run-dir" in line


def test_a_read_only_run_dir_is_a_one_line_error(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o555)
    try:
        if os.access(run, os.W_OK):
            pytest.skip("this user (root?) can write to a mode-0555 folder")
        assert main(["start", "--run-dir", str(run), "--no-progress"]) == 2
        assert "not writable" in _one_error_line(capsys.readouterr().err)
    finally:
        run.chmod(0o755)


def test_a_read_only_file_system_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    """What a user on a read-only mount saw as a traceback (``OSError: [Errno 30]``); simulated, since a
    test cannot mount one, and it runs for root too (which the permission test above cannot)."""
    import errno
    from pathlib import Path

    def read_only(self, data):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "write_bytes", read_only)
    assert main(["silo", "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "not writable (Read-only file system)" in line and "--run-dir" in line


def test_a_model_not_in_the_local_cache_fails_at_once_with_a_hint(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("node.sources.locate._in_hf_cache", lambda repo_id, cache_dir=None: False)  # whatever this machine holds
    assert main(["silo", "--run-dir", str(tmp_path), "--no-progress", "model.name_or_path=nobody/no-such-model"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "model.name_or_path='nobody/no-such-model'" in line and "hf download nobody/no-such-model" in line


@pytest.mark.parametrize(
    ("peer", "reason"),
    [
        ("/ip4/127.0.0.1/tcp/31337/p2p/notapeerid", "p2p:"),
        ("/ip4/127.0.0.999/tcp/31337/p2p/12D3KooWDePaggDhKViWWG9BiNRGvevgFHi49xfYoAErMVvSS9oA", "ip4:"),
        ("/ip4/127.0.0.1/tcp/99999/p2p/12D3KooWDePaggDhKViWWG9BiNRGvevgFHi49xfYoAErMVvSS9oA", "tcp:"),
    ],
)
def test_a_bad_initial_peer_is_a_one_line_error_at_start(tmp_path, capsys, peer, reason):
    assert main(["start", "--run-dir", str(tmp_path), "--no-progress", "--initial-peers", peer]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "initial_peers" in line and peer in line and reason in line


def test_user_errors_are_reported_before_torch_or_hivemind_is_imported(tmp_path):
    """Every user-error path of the CLI answers from light imports only (hence within a second or two)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("train: [unclosed\n")
    script = f"""
import sys

import pytest
from node.cli import main
import node.sources.locate as locate
locate._in_hf_cache = lambda repo_id, cache_dir=None: False
run = {str(tmp_path / "run")!r}
cases = [
    ["silo", "--run-dir", run, "train.loss=ppo"],
    ["silo", "--run-dir", run, "no.such.key=1"],
    ["silo", "-c", "configs/no-such.yaml"],
    ["silo", "-c", {str(bad_yaml)!r}],
    ["silo", "--run-dir", {str(blocker / "run")!r}],
    ["silo", "--run-dir", run, "model.name_or_path=nobody/no-such-model"],
    ["start", "--run-dir", run, "--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/notapeerid"],
    ["start", "--run-dir", run, "--initial-peers", "/ip4/127.0.0.1/tcp/1"],
    ["start", "--run-dir", run, "swarm.host_maddrs=[/ip4/1.2.3.4/tcp/x]"],
    ["silo", "--run-dir", run, "adapter.init_from=" + {str(tmp_path / "no-such-run")!r}],
]
codes = [main(case) for case in cases]
heavy = sorted(m for m in ("torch", "transformers", "peft", "hivemind") if m in sys.modules)
print(codes, heavy)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == f"{[2] * 10} []", proc.stdout + proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 10, proc.stderr  # one line each


def test_summarize_run_on_a_missing_run_dir_is_a_one_line_error(tmp_path):
    proc = subprocess.run([sys.executable, "scripts/summarize_run.py", str(tmp_path / "nope")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no run dir" in proc.stderr


def test_keygen_to_an_unwritable_path_is_a_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["keygen", "--out", str(blocker / "keys" / "id.pem")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "--out" in line and "cannot be written" in line and "writable path" in line


def test_resuming_with_changed_settings_says_what_changed_and_logs_to_node_log(tmp_path, capsys, caplog):
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    run = tmp_path / "run"
    common = ["silo", "-c", "configs/tiny-silo.yaml", "--run-dir", str(run), "--no-progress", "sapo.local_groups=2",
              "generation.group_size=2", "tasks.eval_size=4", "train.checkpoint_every=1", "tracking.log_max_mb=0.0005",
              "tracking.log_backups=1"]
    try:
        assert main([*common, "train.steps=2"]) == 0
        caplog.clear()
        assert main([*common, "train.steps=3", "train.lr=0.002"]) == 0
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    changed = [r.getMessage() for r in caplog.records if "changed settings" in r.getMessage()]
    assert changed == ["resuming run with changed settings: train.lr 0.001 -> 0.002; train.steps 2 -> 3"]
    logs = sorted(p.name for p in run.glob("node.log*"))
    assert logs == ["node.log", "node.log.1"]  # rotated past tracking.log_max_mb, one backup kept
    assert all(p.stat().st_size <= 1024 for p in run.glob("node.log*"))
    assert "checkpoint written" in (run / "node.log").read_text() + (run / "node.log.1").read_text()


def test_summarize_run_prints_step_time_memory_and_the_logprob_gap(tmp_path):
    rows = [{"step": i, "reward_mean": r, "step_seconds": s, "peak_rss_mb": m, "train/logprob_gap_abs": g,
             "train/logprob_gap_kl": k}
            for i, (r, s, m, g, k) in enumerate([(0.1, 3.0, 900, 0.02, 0.001), (0.2, 1.0, 1200, 0.04, 0.003),
                                                 (0.3, 2.0, 1100, 0.06, 0.002)], start=1)]
    rows[-1]["eval_accuracy"] = 0.5
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run([sys.executable, "scripts/summarize_run.py", str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout
    assert "greedy eval accuracy: step 3: 0.500" in out
    assert "step time: median 2.0 s; peak resident memory 1200 MB" in out
    assert "log-prob gap: mean 4.00e-02 a token (k3 KL 2.00e-03)" in out
