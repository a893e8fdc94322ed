"""benchmarks/multi_gpu.py: the comparison with the one-device run, the report and the option
errors (the runs themselves are GPU benchmarks; a CPU run of every mesh is in the module's
docstring and takes minutes)."""

import json
import os

import pytest

from benchmarks import multi_gpu as mg


def _run(out, name, devices, mesh, losses, vals, tok_s, rc=0, log=""):
    workdir = os.path.join(out, name)
    os.makedirs(workdir, exist_ok=True)
    rows = [{"step": 5 * (i + 1), "train_loss": loss, "tokens_per_sec": tok_s,
             "step_time": 1.0, "mfu": None} for i, loss in enumerate(losses)]
    rows += [{"step": step, "val_loss": v} for step, v in vals.items()]
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    with open(workdir + ".run.json", "w") as f:
        json.dump({"name": name, "devices": devices, "mesh": mesh, "rc": rc, "params": 10,
                   "wall_s": 1.0, "command": f"python experiments/train.py {name}"}, f)
    with open(workdir + ".log", "w") as f:
        f.write(log)


def test_collect_compares_with_one_device_and_checks_the_restore(tmp_path):
    out = str(tmp_path)
    losses = [10.0, 8.0, 6.0, 5.0]
    _run(out, "1dev", 1, [1, 1, 1], losses, {20: 7.0}, 100.0)
    _run(out, "dp", 2, [2, 1, 1], [10.0, 8.04, 6.0, 5.0], {20: 7.0}, 150.0)
    _run(out, "tp", 2, [1, 1, 2], [10.0, 8.0, 6.6, 5.0], {20: 7.0}, 90.0)  # 10% off at step 15
    _run(out, "fsdp", 2, [1, 2, 1], losses, {20: 7.5}, 120.0)
    _run(out, "restore_1dev", 1, [1, 1, 1], [], {20: 7.5},
         0.0, log="Resuming from the checkpoint at step 20 in ...\n")
    result = mg.collect(out, skip_windows=1, rel_tol=0.01)
    runs = result["runs"]
    assert runs["dp"]["train_rel_diff"] == pytest.approx(0.005)
    assert runs["dp"]["ok"] and not runs["tp"]["ok"]
    assert runs["dp"]["scaling_efficiency"] == pytest.approx(0.75)
    assert runs["tp"]["per_device_tokens_per_sec"] == pytest.approx(45.0)
    assert runs["fsdp"]["val_rel_diff"] == pytest.approx(0.5 / 7.0)  # val differs: not ok
    assert not runs["fsdp"]["ok"]
    restore = runs["restore_1dev"]
    assert restore["resumed"] and restore["ok"] and restore["val_rel_diff"] == 0.0
    md = mg.render(json.loads(json.dumps(result)))  # as read back from the JSON file
    assert "| dp | 2 | (2, 1, 1) | 150 | 75 | 75.00% |" in md
    assert "| tp | 2 | (1, 1, 2) |" in md and "**no**" in md
    assert "restored by the trainer on 1 device: validation loss 7.500000 vs 7.500000" in md
    mg.plot(result, str(tmp_path / "curves.png"))
    assert os.path.getsize(tmp_path / "curves.png") > 1000


def test_collect_drops_a_last_line_cut_short_by_a_killed_trainer(tmp_path):
    out = str(tmp_path)
    losses = [10.0, 8.0, 6.0, 5.0]
    _run(out, "1dev", 1, [1, 1, 1], losses, {20: 7.0}, 100.0)
    _run(out, "dp", 2, [2, 1, 1], losses, {20: 7.0}, 150.0)
    whole = mg.collect(out, skip_windows=1, rel_tol=0.01)["runs"]
    for name in ("1dev", "dp"):
        with open(os.path.join(out, name, "metrics.jsonl"), "a") as f:
            f.write('{"step": 25, "train_loss": 4.')  # killed mid-record
    cut = mg.collect(out, skip_windows=1, rel_tol=0.01)["runs"]
    assert cut == whole
    assert cut["dp"]["ok"] and cut["dp"]["train"] == dict(zip((5, 10, 15, 20), losses))


def test_a_restore_that_did_not_resume_fails_and_failed_runs_are_named(tmp_path):
    out = str(tmp_path)
    _run(out, "1dev", 1, [1, 1, 1], [10.0, 8.0], {10: 7.0}, 100.0)
    _run(out, "fsdp", 2, [1, 2, 1], [10.0, 8.0], {10: 7.0}, 100.0)
    _run(out, "restore_1dev", 1, [1, 1, 1], [], {10: 7.0}, 0.0, log="No checkpoint in ...\n")
    _run(out, "dp", 2, [2, 1, 1], [], {}, 0.0, rc=1)
    runs = mg.collect(out, skip_windows=0, rel_tol=0.01)["runs"]
    assert not runs["restore_1dev"]["ok"]
    assert runs["dp"]["error"] == "exit 1, see dp.log"
    assert "failed: exit 1, see dp.log" in mg.render(mg.collect(out, 0, 0.01))


def test_option_errors_are_named(tmp_path):
    with pytest.raises(SystemExit, match="unknown run 'ddp'"):
        mg.main([f"--out={tmp_path}", "--runs=ddp", "--cpu_devices=2"])
    with pytest.raises(SystemExit, match="needs at least 2 devices, found 1"):
        mg.main([f"--out={tmp_path}", "--runs=dp", "--cpu_devices=1"])
    with pytest.raises(SystemExit, match="needs the fsdp run's checkpoint"):
        mg.main([f"--out={tmp_path}", "--runs=restore_1dev", "--cpu_devices=2"])
    with pytest.raises(SystemExit, match="--steps must be >= 1, got -5"):
        mg.main([f"--out={tmp_path}", "--cpu_devices=2", "--steps=-5"])
    with pytest.raises(SystemExit, match="--cpu_devices must be >= 1, got 0"):
        mg.main([f"--out={tmp_path}", "--cpu_devices=0"])
    with pytest.raises(SystemExit, match="--num_devices is for GPU runs"):
        mg.main([f"--out={tmp_path}", "--cpu_devices=2", "--num_devices=4"])
    with pytest.raises(SystemExit, match="--batch_size=8 does not split over the 3 devices"):
        mg.main([f"--out={tmp_path}", "--cpu_devices=3", "--runs=1dev,dp"])
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit, match="--out=.*file"):
        mg.main([f"--out={tmp_path / 'file'}", "--cpu_devices=2", "--runs=1dev"])


def test_a_failed_run_stops_the_sweep_with_the_trainers_error(tmp_path):
    # The child trainer rejects the preset at start-up; the driver names the run and the reason,
    # exits non-zero and does not start the next run.
    with pytest.raises(SystemExit, match=r"run 1dev failed \(.*arch='foo'"):
        mg.main([f"--out={tmp_path}", "--cpu_devices=2", "--runs=1dev,dp", "--tiny",
                 "--preset=arch=foo,stack=hybrid,opt=muon"])
    assert os.path.exists(tmp_path / "1dev.log") and not os.path.exists(tmp_path / "dp.log")
    assert "failed: exit" in (tmp_path / "multi_gpu.md").read_text()
