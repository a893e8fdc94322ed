"""benchmarks/train_throughput.py: the metrics summary and the markdown table (the GPU run
itself is a benchmark, not a test)."""

import importlib.util
import json
import os
import random

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "train_throughput.py")
_spec = importlib.util.spec_from_file_location("train_throughput", _PATH)
tt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tt)


def _write_metrics(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def test_summarise_drops_warmup_windows_and_averages(tmp_path):
    rows = [{"step": 10, "train_loss": 9.0, "tokens_per_sec": 50.0, "step_time": 2.0,
             "mfu": 0.1},
            {"step": 20, "train_loss": 8.0, "tokens_per_sec": 100.0, "step_time": 1.0,
             "mfu": 0.2},
            {"step": 30, "train_loss": 7.0, "tokens_per_sec": 300.0, "step_time": 0.5,
             "mfu": 0.4},
            {"step": 30, "val_loss": 7.5}]
    path = str(tmp_path / "metrics.jsonl")
    _write_metrics(path, rows)
    out = tt.summarise(path, skip_windows=1)
    assert out["tokens_per_sec"] == pytest.approx(200.0)
    assert out["step_time"] == pytest.approx(0.75)
    assert out["mfu"] == pytest.approx(0.3)
    assert (out["windows"], out["first_loss"], out["last_loss"], out["val_loss"]) == (
        2, 9.0, 7.0, 7.5)
    with pytest.raises(ValueError, match="none left after skipping 3"):
        tt.summarise(path, skip_windows=3)
    rows[2]["mfu"] = None  # no peak FLOP/s known (CPU): no MFU
    _write_metrics(path, rows)
    assert tt.summarise(path, skip_windows=1)["mfu"] is None


def test_summarise_drops_a_last_line_cut_short_by_a_killed_trainer(tmp_path):
    # A trainer killed mid-record (an OOM kill, a timeout) leaves the last line cut short;
    # the strict json loop raised on it, losing the run's windows.
    rng = random.Random(3)
    rows = [{"step": 10 * (i + 1), "train_loss": rng.uniform(2, 9),
             "tokens_per_sec": rng.uniform(50, 500), "step_time": rng.uniform(0.1, 2),
             "mfu": rng.uniform(0, 0.5)} for i in range(rng.randrange(3, 8))]
    path = str(tmp_path / "metrics.jsonl")
    _write_metrics(path, rows)
    whole = tt.summarise(path, skip_windows=1)
    with open(path, "a") as f:
        f.write(json.dumps(rows[0])[:rng.randrange(5, 30)])
    assert tt.summarise(path, skip_windows=1) == whole
    timed = rows[1:]
    assert whole["tokens_per_sec"] == pytest.approx(
        sum(r["tokens_per_sec"] for r in timed) / len(timed))
    assert whole["last_loss"] == rows[-1]["train_loss"]
    with open(path, "a") as f:
        f.write("\n" + json.dumps(rows[0]) + "\n")  # a bad line in the middle: an error
    with pytest.raises(ValueError, match=r"metrics.jsonl, line \d+: not valid JSON"):
        tt.summarise(path, skip_windows=1)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        tt.summarise(str(tmp_path / "missing.jsonl"), skip_windows=1)


def test_render_normalises_to_gdn_pure_and_reports_failures():
    run = dict(tokens_per_sec=100.0, step_time=0.5, mfu=0.25, first_loss=10.0, last_loss=2.0,
               wall_s=60.0, params=300e6, steps=200)
    result = {"date": "2026-01-01T00:00:00", "device": "dev", "versions": {}, "opt": "muon",
              "steps": 200, "batch_size": 8, "seq_len": 4096, "log_every": 10,
              "skip_windows": 2, "command": "cmd",
              "runs": {"gdn_pure": run, "softmax_dense": dict(run, tokens_per_sec=80.0),
                       "kda_hybrid": {"error": "exit 1, see kda_hybrid.log", "wall_s": 1.0},
                       "deltanet_pure": dict(run, tokens_per_sec=120.0)}}
    md = tt.render(result)
    assert "| gdn_pure | 300.0M | 200 | 100 | 0.500 | 25.0% | 100.0% | 100.0% |" in md
    assert "| deltanet_pure | 300.0M | 200 | 120 | 0.500 | 25.0% | 120.0% | n/a |" in md
    assert "muon, size 350m" in md and "the bundled WikiText-2 corpus" in md
    assert "| softmax_dense | 300.0M | 200 | 80 | 0.500 | 25.0% | 80.0% | 79.7% |" in md
    assert "failed: exit 1, see kda_hybrid.log" in md
    assert "accumulation" not in md
    md = tt.render(dict(result, batch_size=128, micro_batch_size=16))
    assert ("128 x 4096 tokens (gradient accumulation: micro-batches of 16 rows per data-parallel "
            "replica, 8 per step on one device)") in md


def test_unknown_preset_is_named(tmp_path):
    with pytest.raises(SystemExit, match="unknown preset 'gdn_puer'"):
        tt.main([f"--out={tmp_path}", "--presets=gdn_puer"])


def test_small_size_runs_every_stack_on_the_given_corpus(tmp_path, monkeypatch):
    commands = []

    def fake_trainer(cmd, log_path, *, label, env=None):
        commands.append((label, cmd))
        return 1, None, 0.5  # a failed run: the table names it, the next preset still runs

    monkeypatch.setattr(tt, "run_trainer", fake_trainer)
    result = tt.main([f"--out={tmp_path}", "--presets=all", "--size=small",
                      "--corpus=/data/prose-llama2", "--batch_size=16", "--steps=40"])
    assert [label for label, _ in commands] == list(tt.PRESETS)
    assert len(commands) == 9
    for label, cmd in commands:
        config = [c for c in cmd if c.startswith("--config=")]
        assert config == [f"--config={tt._ROOT}/configs/table2.py:{tt.PRESETS[label][0]},"
                          f"opt=muon,size=small,corpus=/data/prose-llama2"]
        assert "--config.data.batch_size=16" in cmd and "--config.train.total_steps=40" in cmd
    assert result["size"] == "small" and result["corpus"] == "/data/prose-llama2"
    md = (tmp_path / "train_throughput.md").read_text()
    assert "muon, size small, 40 steps of 16 x 4096 tokens, the LM head and cross-entropy " \
        "fused in chunks of 8,192 tokens" in md
    assert "the corpus `/data/prose-llama2` through the real data pipeline" in md
    assert "| gdn2_hybrid | | | failed: exit 1, see gdn2_hybrid.log |" in md


def test_tiny_has_cpu_sized_defaults_and_explicit_values_win():
    gpu = tt._parse_args(["--out=x"])
    assert (gpu.steps, gpu.batch_size, gpu.seq_len, gpu.log_every, gpu.skip_windows) == (
        200, 8, 4096, 10, 2)
    tiny = tt._parse_args(["--out=x", "--tiny"])  # 8 x 4096 tokens needed ~22 GB on a CPU
    assert (tiny.steps, tiny.batch_size, tiny.seq_len, tiny.log_every, tiny.skip_windows) == (
        8, 2, 128, 2, 1)
    mixed = tt._parse_args(["--out=x", "--tiny", "--seq_len=256", "--steps=3"])
    assert (mixed.steps, mixed.batch_size, mixed.seq_len) == (3, 2, 256)


def test_loss_head_defaults_to_the_sweeps_fused_chunks_and_zero_is_the_plain_head(
        tmp_path, monkeypatch):
    from configs.sweeps import common as sweeps_common
    # The benchmark measures the loss head the Table 2/7 sweeps train with.
    assert dict(sweeps_common.LOSS_CHUNK) == {"train.loss_chunk_size": tt.LOSS_CHUNK_SIZE}
    commands = []
    monkeypatch.setattr(tt, "run_trainer",
                        lambda cmd, log_path, *, label, env=None: (
                            commands.append(cmd) or (1, None, 0.5)))
    chunk = random.Random(5).choice([1024, 4096, 16384])
    for extra, want in (([], tt.LOSS_CHUNK_SIZE), ([f"--loss_chunk_size={chunk}"], chunk),
                        (["--loss_chunk_size=0"], 0)):
        commands.clear()
        result = tt.main([f"--out={tmp_path / str(want)}", "--presets=gdn_pure"] + extra)
        flags = [c for c in commands[0] if c.startswith("--config.train.loss_chunk_size")]
        assert flags == ([f"--config.train.loss_chunk_size={want}"] if want else []), extra
        assert result["loss_chunk_size"] == want
        md = (tmp_path / str(want) / "train_throughput.md").read_text()
        assert (f"fused in chunks of {want:,} tokens" in md) == bool(want), extra
        assert ("the plain LM head" in md) == (not want), extra
    with pytest.raises(SystemExit):
        tt.main([f"--out={tmp_path}", "--loss_chunk_size=-1"])


def test_swiglu_packed_flag_is_passed_to_every_run_and_recorded(tmp_path, monkeypatch):
    # --swiglu_packed=on|off: model.swiglu_packed in every trainer run (MOSAIC_GPU.md Sec.
    # 46.2's A/B), recorded in the JSON (top level and per run) and the report; absent, the
    # config's stands and nothing is passed.
    commands = []

    def fake_trainer(cmd, log_path, *, label, env=None):
        commands.append(cmd)
        os.makedirs(log_path[:-len(".log")], exist_ok=True)
        _write_metrics(os.path.join(log_path[:-len(".log")], "metrics.jsonl"),
                       [dict(step=s, tokens_per_sec=1000.0 + s, step_time=0.5, mfu=0.3,
                             train_loss=5.0 - s / 10) for s in (2, 4, 6)])
        return 0, 1234, 0.5

    monkeypatch.setattr(tt, "run_trainer", fake_trainer)
    presets = random.Random(7).sample(list(tt.PRESETS), 2)
    for flag, want in (([], None), (["--swiglu_packed=on"], True),
                       (["--swiglu_packed=off"], False)):
        commands.clear()
        out = tmp_path / str(want)
        result = tt.main([f"--out={out}", f"--presets={','.join(presets)}", "--tiny"] + flag)
        assert len(commands) == 2
        for cmd in commands:
            flags = [c for c in cmd if c.startswith("--config.model.swiglu_packed")]
            assert flags == ([] if want is None else [f"--config.model.swiglu_packed={want}"])
        saved = json.loads((out / "train_throughput.json").read_text())
        for record in (result, saved):
            assert record["swiglu_packed"] is want
            assert [record["runs"][p]["swiglu_packed"] for p in presets] == [want, want]
        md = (out / "train_throughput.md").read_text()
        line = f"- model.swiglu_packed={'on' if want else 'off'} (--swiglu_packed"
        assert (line in md) == (want is not None), flag
    with pytest.raises(SystemExit):
        tt.main([f"--out={tmp_path}", "--swiglu_packed=yes"])
