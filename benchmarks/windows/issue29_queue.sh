#!/usr/bin/env bash
# Issue 29's GPU queue (pallas_kernels/common/MOSAIC_GPU.md Sec. 34), for the minutes a device
# window has left. Usage, on the device machine, from the repository root (carry .whl when
# /tmp/site is not there yet):
#   bash benchmarks/windows/issue29_queue.sh <budget_s> [item ...]
# Items, in order (estimate in seconds; each runs once per machine and only if its estimate
# fits the time left, else the next one that fits):
#   t0glue 150  Sec. 36: --mosaic_forward=fused_t0 with the T0 kernel forming W (no XLA glue)
#               and the S2 fallback to three_pass, jla beside it, then the W gpu tests
#               (decision rule in Sec. 36)
#   t0w 340     Sec. 38: the W gpu tests and the op's fused_t0 gpu tests that t0glue's timeout
#               left out, then the S1 training step with fused_t0 and with fused_t0_split
#               (state_ag, 3 stages) in two processes (decision rule in Sec. 38)
#   prof_split 120  Sec. 39 (27 s on an H100): the split forward kernel's stage ablations (state_ag, 3 stages:
#               io, state, readout, full, no_store, nobar) at S1 in one profile_fwd.py run,
#               ptxas lines (decision rule in Sec. 39)
#   gva 270     Sec. 33: fused_ws's GVA loop at K = 64, its bench and its four gpu tests
#   t0 250      Sec. 32.2: --mosaic_forward=fused_t0 with the default backward, jla beside it
#   vk 150      Sec. 35.4: the split forward, state_ag + 3 stages, state layout vk and kv,
#               fused_t0 and jla, then vk's gpu tests (decision rule in Sec. 35.4)
#   split1 145  Sec. 17.1 call 1: state_ag:3 and prepare_mid:3 split orders
#   split2 145  Sec. 17.1 call 2: state_ag:2 and readout_first:2, then the split gpu tests
#   early 320   Sec. 40: the S1 training step with fused_t0_split (state_ag, 3 stages), the
#               default protocol and then --mosaic_t0_split_protocol=early_s, two processes,
#               then early_s's six gpu tests (decision rule in Sec. 40)
#   autooff 560 Sec. 31.8: the same-run table against our Triton kernels (S1, S2, P1) and the
#               public op's gpu tests (decides mosaic_gpu.AUTO_OFF for GDN)
#   autooff_dn 560  Sec. 34: DeltaNet's same-run table (S1, S2, P1; mosaic, jla, ours = Triton
#               while delta_rule is in AUTO_OFF): decides DeltaNet's AUTO_OFF entry; then the
#               two fp16 gpu tests of the op's defaults (GDN's auto since 2026-12-06f)
#   tp350 480   Sec. 34: GDN-pure 350M training throughput at the recipe's batch (128 x 4096,
#               micro-batches of $TP_MB = 8: 16 ran out of memory on an H100; 20 steps) with
#               model.gdn.implementation=auto (the Mosaic kernels on Hopper since 2026-12-06f)
#               and =pallas (Triton): issue 29's MFU target. Since 2026-12-07b both tools default
#               to the sweeps' fused LM head + loss (train.loss_chunk_size 8192); 12-07's
#               38.1 % was the plain head
#   stepprof 300  Sec. 43.2: where tp350's step goes with the Mosaic kernels (auto): the trainer's
#               step at GBS 128 in micro-batches of $TP_MB = 8, fwd+bwd and optimizer alone, one
#               traced step split into matmuls / other XLA / Pallas (profile_train_step.py)
#   approx 520  Sec. 44/46: GDN S1 and S2 fwd+bwd, Mosaic GPU's approx_math off, on, off, on
#               (--nomosaic_approx_math / --mosaic_approx_math, four processes; decision rule in
#               Sec. 46, after 12-07c's one-process-each run left it open)
#   fp16def 110  autooff_dn's two fp16 gpu tests alone (the op's defaults in fp16, which GDN's
#               auto runs since 2026-12-06f), for a window too short for autooff_dn
#   t0pieces 330  Sec. 42: GDN at S2 and P1 (fwd+bwd, fwd), the fused_t0 forward as sequence
#               pieces (--mosaic_t0_pieces, jla beside it) against the three_pass fallback
#               (--nomosaic_t0_pieces), in two processes (ran on 2026-12-06g), then the pieces path's four gpu tests (decision rule in Sec. 42.1)
# The per-channel family (KDA, GDN-2; MOSAIC_GPU.md Sec. 37, decision rules there), after those:
#   cw_state 320  Sec. 18.1: KDA's state passes mosaic vs triton, S1 then S2, fwd+bwd and fwd,
#                 jla in the same processes
#   cw_diag 210   Sec. 41: K1 and K2 (wrong on the H100 of 2026-12-06f) compiled at a small shape
#                 against float64 on 13 probe inputs, full, K1's four taps and no_band, slab 16
#                 and 32: per output the relative RMS, non-finite count and where the error is
#                 (diag_grad.py; decision rule in Sec. 41; ran 2026-12-07, the fixes of
#                 Sec. 43 after it: rerun, decision rule in Sec. 43.3)
#   cw_grad 220   Sec. 20/21: KDA S1 fwd+bwd with grad_pass mosaic_fused (K2), triton, mosaic (K1)
#   cw_tests 320  the 22 gpu tests of the Mosaic state passes, K2 and K1 (11 workers)
#   cw_gdn2 310   GDN-2 S1: the state passes (jla beside them), then the grad passes
#   cw_slab 170   Sec. 24: K2 and K1 at slab 16 and 32 (profile_grad.py)
#   kda_dvw 340   Sec. 47.2/47.4: KDA and GDN-2 S1, S2 fwd and fwd+bwd (the defaults: Mosaic
#               state passes, K2 reading dR heads-first and writing dvw, g floored in the gamma
#               kernel), jla beside, per-kernel breakdown
#   k2floor 230   Sec. 47.5: K2's dg through g's floor: its two gpu tests and the two op tests,
#               then KDA S1 and S2 fwd+bwd against jla
#   swiglu 520    Sec. 47.3: the GDN-pure 350M step (profile_train_step.py, stepprof's command)
#               with --swiglu_packed=off then on, micro-batches of $TP_MB = 8
#   dvn_hf 420    Sec. 48.2: the reverse state pass writes dVn heads-first (no XLA transpose
#               before the dR product): the op's K2 + Mosaic-state-pass gpu tests, then KDA and
#               GDN-2 S1, S2 fwd+bwd against jla with the per-kernel breakdown, then what XLA's
#               remaining fusions at S1 are (benchmarks/hlo_fusions.py)
#   norm_ab 500   Sec. 47.7: rms_norm_gpu_test's gpu tests, then the same step with --set=model.norm_implementation=xla then =pallas
#               (the one-pass Pallas RMSNorm kernels, pallas_kernels/common/rms_norm_gpu.py)
#   tab_gdn 335, tab_dn 455, tab_lgt 335, tab_kda 335, tab_gdn2 335  issue 29's acceptance table
#               on the final kernels (Sec. 49): one op at S1, S2 and P1, fwd+bwd and fwd, ours
#               (auto) and jla in one process per shape (so a cut-short item still has both at
#               its first shapes), per-kernel breakdown; tab_dn adds the mosaic peer (DeltaNet's
#               auto decision, Sec. 34.1's rule)
#   tab_fla 500   the same table's fla column: all five ops at S1, S2, P1 (torch worker, Triton
#               autotune kept in /tmp/flacache for a later call on the same machine)
#   lgt_fused 455  Sec. 50: Lightning's one-kernel forward (simple_gla_mosaic forward="fused",
#               never timed) as peer mosaic beside ours (two_pass) and jla, S1, S2, P1, fwd and
#               fwd+bwd (decision rule in Sec. 50)
#   lgt_ftests 200  the fused forward's gpu tests (kernel_mosaic_gpu_fused_test.py, never run)
#   mix 470     for a short budget: lgt_fused at S1 and P1 only, then dhw's bench (S1, no tests)
#   pskip 420   Sec. 52: GDN at P1 and S2 with --mosaic_piece_skip (jla beside) and without, two
#               processes, then PieceSkipGpuTest (decision rule in Sec. 52)
#   lgt_rh 400  Sec. 54: Lightning fwd+bwd at S1 and P1, the fused forward keeping h for the
#               backward (--mosaic_gla_residual_h) and not, two processes, then its gpu test
#   lgt_st 320  Sec. 55: Lightning fwd and fwd+bwd at S1 and P1, ours (auto: the fused forward,
#               2 stages) beside peer mosaic with a 3-stage ring (--mosaic_gla_stages=3) and jla
#   rs 550      Sec. 56: forward="fused_rs" (the primal-only forward with S^T in registers, jla's
#               schedule) at S1 fwd beside ours (the default forward, fused_rs since
#               2026-12-08) and jla in one process (the gate checks fused_rs named on whole
#               rows at the default gate shape; 8x1024x16 ran out of memory on 12-07i), then
#               fused_rs with a two-stage ring, then its gpu tests (decision rule in Sec. 56)
#   rs_prof 170 Sec. 56: fused_rs's stage ablations (state, readout, full; profile_fwd.py
#               --rs_stages=3) and fused_t0's full at S1, ptxas lines (the rule's next step)
#   rs_proto 560  Sec. 64: fused_rs with protocol="ag_ahead" (the output warpgroup prepares chunk
#               n + 1's Ag before chunk n's read-out) against the default "joint": S1 fwd, jla
#               beside joint (2 stages) and ag_ahead (3 stages) in two processes, ag_ahead with 2
#               stages in a third; profile_fwd's ablations of ag_ahead (3 stages); then the gpu
#               tests of kernel_mosaic_gdn_rs_test.py (decision rule in Sec. 64)
#   mapsx 540   Sec. 57: GDN at S2 and P1, fwd and fwd+bwd, the pieces' maps and passes from zero
#               in one launch (--mosaic_maps_carry_x, jla beside) and not, then at P1 with
#               --mosaic_piece_skip as well, three processes; then MapsCarryXGpuTest (decision
#               rule in Sec. 57)
#   rs_res 550  Sec. 58: fused_rs's residual form (--mosaic_rs_residuals) at S1 fwd+bwd with the
#               stored W and with dh_w="t0", jla beside; then the switch off (fused_t0), jla
#               beside; then its three gpu tests (by name; decision rule in Sec. 58.4)
#   rs_res_st 300  Sec. 58.5: the residual form with residual_from="state" (three stages, no
#               staging), S1 fwd+bwd as rs_res's first process, then its bit-equality gpu test
#   rs_pieces 520  Sec. 60: fused_rs's kernel as the sequence pieces' last launch
#               (--mosaic_rs_pieces) at S2 and P1, fwd and fwd+bwd (--mosaic_rs_residuals), jla
#               beside; then the switch off (fused_t0's pieces); then its two gpu tests
#               (decision rule in Sec. 60)
#   kda_local 520  Sec. 62: KDA's chunk-local forward as one Mosaic GPU kernel
#               (TUNING['chunk_local']="mosaic", off by default, never compiled): its gpu tests,
#               then KDA S1 and S2 fwd and fwd+bwd with the option off, then on (--tuning), jla
#               beside both, per-kernel breakdown and the kernel's ptxas line (rule in Sec. 62)
#   dhw 420     Sec. 51: the reverse state pass forming W from T0 (dh_w="t0", the T0 kernel
#               without W) against the stored W at S1, jla beside, then its six gpu tests
#               (decision rule in Sec. 51; 330 s left the last two tests out on 2026-12-07i)
# Default: the items not yet run on any machine (gva, t0, vk ran on 2026-12-06b, t0glue and
# split1 on 2026-12-06c, prof_split on 2026-12-06d, t0w on 2026-12-06e, split2, early, autooff,
# cw_grad, cw_gdn2 and cw_slab on 2026-12-06f, t0pieces and fp16def on 2026-12-06g, tp350,
# cw_state and cw_diag on 2026-12-07 (autooff_dn there ran out of its bench timeout), stepprof,
# cw_tests, cw_grad, approx and cw_slab on 2026-12-07c, approx, cw_tests, kda_dvw, swiglu and
# k2floor's gpu tests (its bench ran out of device time) on 2026-12-07d, kda_dvw, norm_ab and
# dvn_hf on 2026-12-07e, tab_gdn and tab_kda (S1, S2), tab_gdn2 (S1, S2) and tab_lgt on
# 2026-12-07f, mix and lgt_ftests on 2026-12-07g, rs, rs_res, rs_prof and dhw on 2026-12-07i:
# pages benchmarks/results/mosaic-gpu-h100-2026-12-{06b,06c,06d,06e,06f,06g,07,07c,07d,07e,07f,
# 07g,07i}.md);
# name items to run others.
# Order after 2026-12-07i (MOSAIC_GPU.md Sec. 63: rs, rs_res, rs_prof and dhw ran; fused_rs is the
# default forward): rs_pieces (fused_rs's kernel on S2/P1's pieces: the S2/P1 fwd rows), dhw
# (again: one of its gpu tests failed by 13 % of a tolerance and two did not run), rs_proto
# (Sec. 64: the S1 fwd row's coupling edge); then by name mapsx, kda_local, pskip, tab_gdn (the acceptance table on the new default), tab_kda, tab_dn, lgt_rh,
# lgt_st, tab_lgt, tab_gdn2, tab_fla, tp350; rs_res_st only if the residual form matters again.
# Order before (after 2026-12-07h, MOSAIC_GPU.md Sec. 56-58): rs (GDN's forward with S^T in registers,
# jla's schedule: S1 fwd, the largest gap left), dhw (W from T0 in the reverse pass: the 12-07g
# timing met Sec. 51's rule, its gate and gpu tests are what is left), rs_res (fused_rs's
# residual form at S1 fwd+bwd, both backwards: worth a call only if rs's kernel is at or under
# fused_t0's; else run the next item by name); then by name rs_pieces (Sec. 60: fused_rs on
# S2/P1's pieces, worth a call once rs's kernel beats fused_t0's), mapsx (Sec. 57, S2/P1), pskip
# (Sec. 52), tab_kda (Sec. 49.1's rule for prepare at P1), tab_dn (DeltaNet's table and its
# auto decision), rs_prof (if rs is kept but not adopted), lgt_rh (Sec. 54), lgt_st (Sec. 55),
# tab_lgt (Lightning with forward="auto", Sec. 50.1), tab_gdn2 (P1 never timed) and the fla
# column (tab_fla); one item per call (give each its estimate + 35 s: the wheels' install
# comes first on a fresh machine). Then the 350M throughput (tp350; TP_MB=16 on an H200).
# autooff_dn, cw_state, cw_tests and the rest by name.
# Everything comes back as one tarball $OUT/i29-<stamp>.tar.gz plus $OUT/i29.log. I29_TMP
# (default /tmp) moves /tmp/i29out and /tmp/i29done (tests/benchmarks/issue29_queue_test.py).
B=${1:?budget_s}; shift
ITEMS=${*:-rs_pieces dhw rs_proto}
export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
SECONDS=0
if [ ! -d /tmp/site/jla ] && ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
fi
SETUP_S=$SECONDS  # the wheels' install on a fresh machine: counted against the budget
# The device copy's git metadata is not refreshed between calls, so the header also names the
# code by content: the same command on the development machine gives the same digest.
CODE=$(find pallas_kernels lattn_jax -name '*.py' | LC_ALL=C sort | xargs cat | sha1sum | cut -c1-12)
STAMP=$(date -u +%Y%m%dT%H%M%S)
I=${I29_TMP:-/tmp}; O=$I/i29out/$STAMP; mkdir -p $O $I/i29done
LOG=$O/i29.log
est() { case $1 in t0glue) echo 150;; t0w) echo 340;; prof_split) echo 120;; gva) echo 270;;
  t0) echo 250;; vk) echo 150;;
  split1|split2) echo 145;; early) echo 320;; autooff) echo 560;; cw_state|cw_tests) echo 320;;
  autooff_dn) echo 560;; tp350) echo 480;; stepprof) echo 300;; approx) echo 520;; t0pieces) echo 330;; fp16def) echo 110;;
  cw_diag) echo 210;; cw_grad) echo 220;; cw_gdn2) echo 310;; cw_slab) echo 170;;
  kda_dvw) echo 340;; swiglu) echo 520;; k2floor) echo 230;; norm_ab) echo 500;;
  dvn_hf) echo 420;;
  tab_gdn|tab_lgt|tab_kda|tab_gdn2) echo 335;; tab_dn|lgt_fused) echo 455;; tab_fla) echo 500;;
  lgt_ftests) echo 200;; dhw) echo 420;; mix) echo 470;; pskip) echo 420;; lgt_rh) echo 400;; lgt_st) echo 320;;
  rs) echo 550;; rs_prof) echo 170;; rs_proto) echo 560;; rs_res) echo 550;; rs_res_st) echo 300;;
  mapsx) echo 540;; rs_pieces) echo 520;; kda_local) echo 520;;
  *) echo 100000;; esac; }
T=tests/pallas_kernels

gdn_show() {  # one line per bench_kernels record in the logs: what ran, kernel ms, per kernel
  cat "$@" | python3 -c 'import sys,json
for l in sys.stdin.buffer.read().decode(errors="replace").splitlines():
  if l.startswith("{") and "kernel_ms" in l:
    r=json.loads(l); print(r["peer"],r["shape"],r["pass_"],r.get("mosaic_forward_run"),
      r.get("mosaic_t0"),round(r["kernel_ms"],3),
      {k[:40]:round(v,4) for k,v in (r.get("kernels") or {}).items()})'
}

run_t0glue() {
  mkdir -p $O/t0glue; local s=$SECONDS
  timeout 125 python3 benchmarks/bench_kernels.py --ops=gdn --peers=mosaic,jla \
    --passes=fwdbwd,fwd --shapes=S1,S2 --mosaic_forward=fused_t0 --iters=20 --warmup=3 \
    --out=$O/t0glue/gdn > $O/t0glue/gdn.log 2>&1; echo "bench rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/t0glue/gdn.log | cut -c1-200
  gdn_show $O/t0glue/gdn.log
  timeout $((148 - SECONDS + s)) python3 -m pytest -m gpu -q -p no:cacheprovider -s \
    -k test_w_matches_wy_factor $T/kernel_mosaic_gdn_t0_test.py 2>&1 \
    | grep -a -E 'W: relative|passed|failed|FAILED|Error' | cut -c1-250 | tail -6
}

run_t0w() {
  mkdir -p $O/t0w; local s=$SECONDS f
  local t=$T/kernel_mosaic_gdn_t0_test.py::GpuTest
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 150 python3 benchmarks/gpu_tests.py --jobs=8 --deadline_s=135 \
    --out=$O/t0w/gpu_tests $t::test_w_matches_wy_factor_cpc8_gva_packed_partial_T3000_K128 \
    $t::test_w_matches_wy_factor_fp16_deltanet_T1000_K64 $t::test_vjp_fused_t0_matches_chunked_vjp \
    $t::test_vjp_fused_t0_split_matches_chunked_vjp \
    $t::test_forward_fused_t0_matches_reference_and_three_pass_deltanet_h0_partial_T1000_K128_V128 \
    $t::test_forward_fused_t0_matches_reference_and_three_pass_gva_h0_packed_T4096_K128_V128 \
    $T/kernel_mosaic_gdn_vjp_test.py::GpuTest::test_fused_backward_matches_chunked_vjp_deltanet_partial_T1000_K64_V64_fused_t0_fused_ws
  echo "gpu tests rc=$? t=$((SECONDS-s))s"
  cut -c1-220 $O/t0w/gpu_tests/summary.md | tail -14
  grep -a -h 'W: relative' $O/t0w/gpu_tests/workers.log | sort -u | cut -c1-200
  for f in fused_t0 fused_t0_split; do local x=""
    [ $f = fused_t0 ] || x="--mosaic_t0_split_order=state_ag --mosaic_t0_split_stages=3"
    timeout 90 python3 benchmarks/bench_kernels.py --ops=gdn --peers=mosaic --passes=fwdbwd \
      --shapes=S1 --mosaic_forward=$f $x --iters=20 --warmup=3 --out=$O/t0w/$f \
      > $O/t0w/$f.log 2>&1; echo "$f rc=$? t=$((SECONDS-s))s"
  done
  grep -a -h '^gate' $O/t0w/fused_t0*.log | cut -c1-200
  gdn_show $O/t0w/fused_t0*.log
}

run_prof_split() {
  mkdir -p $O/prof_split; local s=$SECONDS
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 110 python3 benchmarks/profile_fwd.py --split_order=state_ag \
    --split_stages=3 --deadline_s=100 --out=$O/prof_split/split_stages \
    > $O/prof_split/split.log 2>&1; echo "profile rc=$? t=$((SECONDS-s))s"
  cw_ptxas fused_t0_fwd_split $O/prof_split/split.log
  grep -a -h -E '^\| ' $O/prof_split/split_stages.md | cut -c1-220
}

run_gva() {
  mkdir -p $O/gvaws; local s=$SECONDS
  timeout 100 python3 benchmarks/bench_gva_loop.py --kernels=fused --shape=8x4096x16 \
    --kv_heads=8 --dim=64 > $O/gvaws/k64.log 2>&1; echo "bench rc=$? t=$((SECONDS-s))s"
  cat $O/gvaws/k64.log | tail -20
  MOSAIC_GPU_DUMP_PTXAS=1 python3 benchmarks/gpu_tests.py --jobs=4 --deadline_s=150 \
    --out=$O/gvaws/gpu_tests \
    $T/kernel_mosaic_gdn_bwd_fused_test.py::GpuTest::test_gva_loop_matches_references_gva2_packed_T2048_K64_V64 \
    $T/kernel_mosaic_gdn_bwd_fused_test.py::GpuTest::test_gva_loop_matches_references_gva4_deltanet_partial_T1000_K64_V128 \
    $T/kernel_mosaic_gdn_vjp_test.py::GpuTest::test_gva_loop_matches_chunked_vjp_gva2_h0_dht_packed_T2048_K64_V64 \
    $T/kernel_mosaic_gdn_vjp_test.py::GpuTest::test_gva_loop_matches_chunked_vjp_gva4_deltanet_partial_T1000_K64_V128
  echo "gpu tests rc=$? t=$((SECONDS-s))s"
  cut -c1-200 $O/gvaws/gpu_tests/summary.md
}

run_t0() {
  mkdir -p $O/t0; local s=$SECONDS
  timeout 240 python3 benchmarks/bench_kernels.py --ops=gdn --peers=mosaic,jla \
    --passes=fwdbwd,fwd --shapes=S1,S2 --mosaic_forward=fused_t0 --iters=30 --warmup=5 \
    --out=$O/t0/gdn > $O/t0/gdn.log 2>&1; echo "bench rc=$? t=$((SECONDS-s))s"
  grep -a -h kernel_ms $O/t0/gdn.log | cut -c1-300
}

run_vk() {
  mkdir -p $O/vk; local s=$SECONDS
  local b="python3 benchmarks/bench_kernels.py --ops=gdn --passes=fwd --shapes=S1 --iters=20 --warmup=3"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 80 $b --peers=jla,mosaic --mosaic_forward=fused_t0_split \
    --mosaic_t0_split_order=state_ag --mosaic_t0_split_stages=3 \
    --mosaic_t0_split_state_layout=vk,kv --out=$O/vk/sa3 > $O/vk/sa3.log 2>&1
  echo "jla+sa3 rc=$? t=$((SECONDS-s))s"
  timeout $((115 - SECONDS + s)) $b --peers=mosaic --mosaic_forward=fused_t0 --out=$O/vk/t0 \
    > $O/vk/t0.log 2>&1; echo "t0 rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/vk/*.log | cut -c1-200
  gdn_show $O/vk/*.log
  grep -a -h -E 'sa_s3.*(egisters|spill)|(egisters|spill).*sa_s3' $O/vk/sa3.log | sort -u | head -4
  timeout $((148 - SECONDS + s)) python3 -m pytest -m gpu -q -p no:cacheprovider -k \
    "vk and (state_ag or close)" $T/kernel_mosaic_gdn_t0_test.py 2>&1 \
    | grep -a -E 'passed|failed|FAILED|Error' | cut -c1-250 | tail -8
}

split_loop() {
  for v in "$@"; do local o=${v%:*} st=${v#*:}; local n=split_${o}_s$st
    MOSAIC_GPU_DUMP_PTXAS=1 timeout 65 python3 benchmarks/bench_kernels.py \
      --ops=gdn --peers=mosaic --passes=fwd --shapes=S1 --mosaic_forward=fused_t0_split \
      --mosaic_t0_split_order=$o --mosaic_t0_split_stages=$st --out=$O/split/$n \
      > $O/split/$n.log 2>&1
    echo "$n rc=$?"; grep -a -E '^gate|^\| ' $O/split/$n.log | tail -3 | cut -c1-300
  done
}

run_split1() { mkdir -p $O/split; split_loop state_ag:3 prepare_mid:3; }

run_split2() {
  mkdir -p $O/split; local s=$SECONDS
  split_loop state_ag:2 readout_first:2
  local x; x=$(python3 -c 'import xdist' 2>/dev/null && echo '-n 4')
  timeout $((145 - SECONDS + s)) python3 -m pytest -m gpu -k split $x -q -p no:cacheprovider \
    $T/kernel_mosaic_gdn_t0_test.py 2>&1 | tail -8 | cut -c1-250
}

run_early() {  # Sec. 40: joint (the default) then early_s, same flags otherwise, two processes
  mkdir -p $O/early; local s=$SECONDS
  local b="python3 benchmarks/bench_kernels.py --ops=gdn --peers=mosaic --passes=fwdbwd"
  b="$b --shapes=S1 --mosaic_forward=fused_t0_split --mosaic_t0_split_order=state_ag"
  b="$b --mosaic_t0_split_stages=3 --iters=20 --warmup=3"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 90 $b --out=$O/early/joint > $O/early/joint.log 2>&1
  echo "joint rc=$? t=$((SECONDS-s))s"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout $((180 - SECONDS + s)) $b --mosaic_t0_split_protocol=early_s \
    --out=$O/early/early_s > $O/early/early_s.log 2>&1; echo "early_s rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/early/joint.log $O/early/early_s.log | cut -c1-200
  gdn_show $O/early/joint.log $O/early/early_s.log
  cw_ptxas fused_t0_fwd_split $O/early/joint.log $O/early/early_s.log
  local t=$T/kernel_mosaic_gdn_t0_test.py::GpuTest::test_fused_t0_split_early_s
  local r=${t}_kernel_matches_reference
  MOSAIC_GPU_DUMP_PTXAS=1 timeout $((310 - SECONDS + s)) python3 benchmarks/gpu_tests.py --jobs=6 \
    --deadline_s=$((290 - SECONDS + s)) --out=$O/early/gpu_tests ${t}_is_bit_equal \
    ${r}_gva_h0_packed_T4096_K128_V128 ${r}_plain_T2048_K128_V128 \
    ${r}_strong_decay_h0_partial_T1000_K64_V128 ${r}_deltanet_h0_packed_T2048_K64_V64 \
    ${r}_fp16_packed_T3000_K128_V64
  echo "gpu tests rc=$? t=$((SECONDS-s))s"
  cut -c1-220 $O/early/gpu_tests/summary.md | tail -12
  grep -a -h 'early_s sa_s3' $O/early/gpu_tests/workers.log | sort -u | cut -c1-220
}

run_autooff() {
  mkdir -p $O/next; local s=$SECONDS
  timeout 300 python3 benchmarks/bench_kernels.py --ops=gdn --peers=mosaic,jla,ours \
    --passes=fwdbwd,fwd --shapes=S1,S2,P1 --iters=30 --warmup=5 --out=$O/next/gdn \
    > $O/next/gdn.log 2>&1; echo "bench rc=$? t=$((SECONDS-s))s"
  timeout 240 python3 benchmarks/gpu_tests.py --jobs=8 --deadline_s=225 \
    --out=$O/next/gpu_tests $T/mosaic_gpu_dispatch_test.py \
    $T/kernel_mosaic_gdn_vjp_test.py::GpuTest; echo "gpu tests rc=$?"
  tail -25 $O/next/gpu_tests/summary.md
}

run_autooff_dn() {
  mkdir -p $O/autooff_dn; local s=$SECONDS
  # 420 s: at 240 s (2026-12-07) only mosaic's S1 and S2 fwd+bwd records had come
  timeout 420 python3 benchmarks/bench_kernels.py --ops=deltanet --peers=mosaic,jla,ours \
    --passes=fwdbwd,fwd --shapes=S1,S2,P1 --iters=30 --warmup=5 --out=$O/autooff_dn/deltanet \
    > $O/autooff_dn/deltanet.log 2>&1; echo "bench rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate\|^- gate\|^- deltanet' $O/autooff_dn/deltanet.md | cut -c1-200
  grep -a -h -E '^\| deltanet' $O/autooff_dn/deltanet.md | cut -c1-200
  # fp16 through the op's defaults (GDN's auto runs them since 2026-12-06f)
  timeout 110 python3 benchmarks/gpu_tests.py --jobs=2 --deadline_s=100 \
    --out=$O/autooff_dn/gpu_tests \
    $T/kernel_mosaic_gdn_vjp_test.py::GpuTest::test_fp16_defaults_match_chunked_vjp_gva_h0_dht_packed_T2048_K128_V128 \
    $T/kernel_mosaic_gdn_vjp_test.py::GpuTest::test_fp16_defaults_match_chunked_vjp_deltanet_partial_T1000_K64_V64
  echo "gpu tests rc=$?"; tail -4 $O/autooff_dn/gpu_tests/summary.md
}

run_fp16def() {  # the op's defaults in fp16 (autooff_dn's tests, without its bench)
  mkdir -p $O/fp16def
  timeout 105 python3 benchmarks/gpu_tests.py --jobs=2 --deadline_s=100 \
    --out=$O/fp16def/gpu_tests \
    $T/kernel_mosaic_gdn_vjp_test.py::GpuTest::test_fp16_defaults_match_chunked_vjp_gva_h0_dht_packed_T2048_K128_V128 \
    $T/kernel_mosaic_gdn_vjp_test.py::GpuTest::test_fp16_defaults_match_chunked_vjp_deltanet_partial_T1000_K64_V64
  echo "gpu tests rc=$?"; tail -4 $O/fp16def/gpu_tests/summary.md
}

run_t0pieces() {  # Sec. 42: fused_t0 as sequence pieces against the three_pass fallback
  mkdir -p $O/t0pieces; local s=$SECONDS
  local b="python3 benchmarks/bench_kernels.py --ops=gdn --passes=fwdbwd,fwd --shapes=S2,P1"
  b="$b --iters=30 --warmup=5 --breakdown_top=12"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 130 $b --peers=mosaic,jla --mosaic_t0_pieces \
    --out=$O/t0pieces/pieces > $O/t0pieces/pieces.log 2>&1
  echo "pieces rc=$? t=$((SECONDS-s))s"
  timeout 90 $b --peers=mosaic --nomosaic_t0_pieces --out=$O/t0pieces/fallback > $O/t0pieces/fallback.log 2>&1
  echo "fallback rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/t0pieces/pieces.log $O/t0pieces/fallback.log | cut -c1-300
  gdn_show $O/t0pieces/pieces.log $O/t0pieces/fallback.log
  grep -a -h -A3 'gdn_chunk_delta_fused_t0_fwd' $O/t0pieces/pieces.log | grep -a -i \
    -E 'registers|spill' | sort | uniq -c | head -6 | cut -c1-200
  local d=$T/mosaic_gpu_dispatch_test.py v=$T/kernel_mosaic_gdn_vjp_test.py
  timeout 100 python3 benchmarks/gpu_tests.py --jobs=4 --deadline_s=95 \
    --out=$O/t0pieces/gpu_tests \
    $d::GdnGpuTest::test_fused_t0_pieces_match_chunked_autodiff_gated_gva_packed_edge_T2048_K128_V128 \
    $d::GdnGpuTest::test_fused_t0_pieces_match_chunked_autodiff_deltanet_partial_T1000_K64_V64 \
    $v::GpuTest::test_fused_t0_pieces_matches_chunked_vjp_gva_h0_dht_packed_edge_T2048_K128_V128 \
    $v::GpuTest::test_fused_t0_pieces_matches_chunked_vjp_strong_decay_h0_partial_T1000_K64_V128
  echo "gpu tests rc=$? t=$((SECONDS-s))s"; tail -6 $O/t0pieces/gpu_tests/summary.md
}

run_tp350() {  # GDN-pure 350M at the recipe's batch: auto (Mosaic on Hopper) against Triton
  mkdir -p $O/tp350; local s=$SECONDS v x
  for v in auto pallas; do
    x="--config.data.val_fraction=0.05 --config.model.gdn.implementation=$v"
    timeout 230 python3 benchmarks/train_throughput.py --out=$O/tp350/$v --presets=gdn_pure \
      --steps=20 --log_every=5 --skip_windows=2 --batch_size=128 --micro_batch_size=${TP_MB:-8} \
      --extra="$x" > $O/tp350/$v.log 2>&1; echo "tp350 $v rc=$? t=$((SECONDS-s))s"
    rm -rf $O/tp350/$v/gdn_pure/checkpoints  # 2.2 GB each: tarring them took 170 s (12-07)
    grep -a -h -E '^\| gdn_pure' $O/tp350/$v/train_throughput.md | cut -c1-200
    grep -a -h -i -E 'out of memory|RESOURCE_EXHAUSTED|Mosaic GPU kernels' $O/tp350/$v.log \
      | sort -u | head -3 | cut -c1-200
  done
}

run_approx() {  # Sec. 44/46: approx_math off / on / off / on, GDN's default Mosaic path
  mkdir -p $O/approx; local s=$SECONDS v i=0
  for v in nomosaic_approx_math mosaic_approx_math nomosaic_approx_math mosaic_approx_math; do
    i=$((i + 1))
    timeout 125 python3 benchmarks/bench_kernels.py --ops=gdn --peers=mosaic \
      --passes=fwdbwd --shapes=S1,S2 --iters=30 --warmup=5 --breakdown_top=10 --$v \
      --out=$O/approx/$i-$v > $O/approx/$i-$v.log 2>&1; echo "$i $v rc=$? t=$((SECONDS-s))s"
    grep -a -h '^gate' $O/approx/$i-$v.log | cut -c1-300
  done
  gdn_show $O/approx/*-*_approx_math.log
}

run_kda_dvw() {  # Sec. 47.2/47.4: KDA and GDN-2 (K2 reading dR heads-first, g floored in the
  # gamma kernel), against jla
  mkdir -p $O/kda_dvw; local s=$SECONDS
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 330 python3 benchmarks/bench_kernels.py --ops=kda,gdn2 \
    --peers=ours,jla --passes=fwdbwd,fwd --shapes=S1,S2 --breakdown_top=16 --iters=30 \
    --warmup=5 --out=$O/kda_dvw/kda > $O/kda_dvw/kda.log 2>&1; echo "bench rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/kda_dvw/kda.log | cut -c1-300
  cw_show $O/kda_dvw/kda.log
  cw_ptxas channelwise_grad_chunk $O/kda_dvw/kda.log
}

run_dvn_hf() {  # Sec. 48.2: dVn heads-first from the reverse state pass; gpu tests, then timing
  mkdir -p $O/dvn_hf; local s=$SECONDS t=$T/kernel_mosaic_channelwise_grad_chunk_test.py
  timeout 100 python3 benchmarks/gpu_tests.py --jobs=4 --deadline_s=90 --out=$O/dvn_hf/gpu_tests \
    "$t::GpuTest::test_op_with_fused_grad_pass_against_fp32_reference0" \
    "$t::GpuTest::test_op_with_fused_grad_pass_against_fp32_reference1"
  echo "gpu tests rc=$? t=$((SECONDS-s))s"
  grep -a -h -E 'Counts|failed|error' $O/dvn_hf/gpu_tests/summary.md | head -6 | cut -c1-220
  timeout 200 python3 benchmarks/bench_kernels.py --ops=kda,gdn2 --peers=ours,jla \
    --passes=fwdbwd --shapes=S1,S2 --breakdown_top=16 --iters=30 --warmup=5 \
    --out=$O/dvn_hf/kda > $O/dvn_hf/kda.log 2>&1; echo "bench rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/dvn_hf/kda.log | cut -c1-300
  cw_show $O/dvn_hf/kda.log
  # what the remaining XLA fusions of the fwd+bwd step are (op_name metadata, fused ops)
  local op n
  for op in kda gdn2; do
    n='loop_transpose_fusion|loop_convert\w*fusion|input_transpose_fusion|gemm_fusion_dot'
    timeout 60 python3 benchmarks/hlo_fusions.py --op=$op --shape=S1 --names="$n" \
      > $O/dvn_hf/hlo_$op.log 2>&1; echo "hlo $op rc=$? t=$((SECONDS-s))s"
    cut -c1-260 $O/dvn_hf/hlo_$op.log | head -60
  done
}

run_k2floor() {  # Sec. 47.5: K2 takes dg through g's floor; its gpu tests, then KDA S1 vs jla
  mkdir -p $O/k2floor; local s=$SECONDS
  timeout 100 python3 benchmarks/gpu_tests.py --jobs=6 --deadline_s=90 --out=$O/k2floor/gpu_tests \
    "$T/kernel_mosaic_channelwise_grad_chunk_test.py::GpuTest::test_unfloored_g_takes_dg_through_the_floor_kda" \
    "$T/kernel_mosaic_channelwise_grad_chunk_test.py::GpuTest::test_unfloored_g_takes_dg_through_the_floor_gdn2_slab16" \
    "$T/kernel_mosaic_channelwise_grad_chunk_test.py::GpuTest::test_op_with_fused_grad_pass_against_fp32_reference0" \
    "$T/kernel_mosaic_channelwise_grad_chunk_test.py::GpuTest::test_op_with_fused_grad_pass_against_fp32_reference1"
  echo "gpu tests rc=$? t=$((SECONDS-s))s"
  grep -a -h -E 'Counts|failed|error' $O/k2floor/gpu_tests/summary.md | head -6 | cut -c1-220
  timeout 120 python3 benchmarks/bench_kernels.py --ops=kda --peers=ours,jla --passes=fwdbwd \
    --shapes=S1,S2 --breakdown_top=16 --iters=30 --warmup=5 --out=$O/k2floor/kda \
    > $O/k2floor/kda.log 2>&1; echo "bench rc=$? t=$((SECONDS-s))s"
  cw_show $O/k2floor/kda.log
}

run_swiglu() {  # Sec. 46.2/47.3: the 350M GDN-pure step, packed SwiGLU off then on (A/B)
  mkdir -p $O/swiglu; local s=$SECONDS v
  for v in off on; do
    timeout 250 python3 benchmarks/profile_train_step.py --preset=gdn_pure --opt=muon \
      --batch=128 --warmup=1 --iters=3 --trace_steps=1 --top=80 \
      --set=train.micro_batch_size=${TP_MB:-8} --set=model.gdn.implementation=auto \
      --swiglu_packed=$v --out=$O/swiglu/$v > $O/swiglu/$v.log 2>&1
    echo "swiglu_packed=$v rc=$? t=$((SECONDS-s))s"
    grep -a -h -E '^\| ' $O/swiglu/$v.md | head -8 | cut -c1-220
    grep -a -h -i -E 'out of memory|RESOURCE_EXHAUSTED' $O/swiglu/$v.log | sort -u | head -2
  done
}

run_norm_ab() {  # Sec. 47.7: the 350M GDN-pure step, RMSNorm by XLA then by Pallas (A/B)
  mkdir -p $O/norm_ab; local s=$SECONDS v
  # the kernels' gpu tests first (compiled against layers.rms_norm); the A/B only if they pass
  timeout 80 python3 -m pytest -m gpu -q -p no:cacheprovider $T/rms_norm_gpu_test.py \
    > $O/norm_ab/gpu_tests.log 2>&1
  local rc=$?; echo "gpu tests rc=$rc t=$((SECONDS-s))s"
  tail -3 $O/norm_ab/gpu_tests.log | cut -c1-220
  [ $rc -eq 0 ] || return
  for v in xla pallas; do
    timeout 210 python3 benchmarks/profile_train_step.py --preset=gdn_pure --opt=muon \
      --batch=128 --warmup=1 --iters=3 --trace_steps=1 --top=80 \
      --set=train.micro_batch_size=${TP_MB:-8} --set=model.gdn.implementation=auto \
      --set=model.norm_implementation=$v --out=$O/norm_ab/$v > $O/norm_ab/$v.log 2>&1
    echo "norm_implementation=$v rc=$? t=$((SECONDS-s))s"
    grep -a -h -E '^\| ' $O/norm_ab/$v.md | head -8 | cut -c1-220
    grep -a -h -i -E 'out of memory|RESOURCE_EXHAUSTED|rms_norm' $O/norm_ab/$v.log | sort -u \
      | head -4 | cut -c1-220
  done
}

run_stepprof() {  # Sec. 43.2: GDN-pure 350M's step split by kernel class, the Mosaic kernels
  mkdir -p $O/stepprof; local s=$SECONDS
  timeout 280 python3 benchmarks/profile_train_step.py --preset=gdn_pure --opt=muon --batch=128 \
    --warmup=1 --iters=3 --trace_steps=1 --top=80 --set=train.micro_batch_size=${TP_MB:-8} \
    --set=model.gdn.implementation=auto --out=$O/stepprof/gdn > $O/stepprof/gdn.log 2>&1
  echo "stepprof rc=$? t=$((SECONDS-s))s"
  grep -a -h -E '^\| ' $O/stepprof/gdn.md | head -14 | cut -c1-220
  grep -a -h -i -E 'out of memory|RESOURCE_EXHAUSTED' $O/stepprof/gdn.log | sort -u | head -2
}

# ---- Sec. 37: the per-channel family's items (KDA, GDN-2), after Sec. 34's -------------------

cw_show() {  # one line per bench_kernels record in the logs: gate, kernel ms, per-channel kernels
  cat "$@" | python3 -c 'import sys,json
for l in sys.stdin:
  if not l.startswith("{\"peer\""): continue
  r=json.loads(l); k=r.get("kernels") or {}
  own={n[:44]:round(v,4) for n,v in k.items() if r["peer"]!="ours" or "channelwise" in n or n=="(other)"}
  print(r["op"],r["shape"],r["pass_"],r["peer"],"sp="+str(r.get("channelwise_state_pass")),
        "gp="+str(r.get("channelwise_grad_pass")),"gate" if r.get("gate") else "RED",
        r.get("kernel_ms") and round(r["kernel_ms"],4),r.get("error","")[:150],own)' | cut -c1-460
}

cw_ptxas() {  # cw_ptxas <kernel regex> <log>...: ptxas's registers, spills, C7514 per kernel
  local pat=$1; shift
  cat "$@" | python3 -c 'import sys
from benchmarks.offline_ptxas import parse_ptxas
seen=set()
for r in parse_ptxas(sys.stdin.read()):
  t=(r["kernel"],r["regs"],r["spill_st"],r["spill_ld"],r["c7514"])
  if t not in seen: seen.add(t); print("ptxas",*t)' | grep -a -E "$pat" | head -16
}

run_cw_state() {
  mkdir -p $O/cw_state; local s=$SECONDS
  local b="python3 benchmarks/bench_kernels.py --ops=kda --peers=ours,jla --passes=fwdbwd,fwd"
  b="$b --channelwise_state_pass=mosaic,triton --breakdown_top=16 --iters=30 --warmup=5"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 150 $b --shapes=S1 --out=$O/cw_state/s1 \
    > $O/cw_state/s1.log 2>&1; echo "S1 rc=$? t=$((SECONDS-s))s"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout $((300 - SECONDS + s)) $b --shapes=S2 --out=$O/cw_state/s2 \
    > $O/cw_state/s2.log 2>&1; echo "S2 rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/cw_state/s1.log $O/cw_state/s2.log | cut -c1-300
  cw_show $O/cw_state/s1.log $O/cw_state/s2.log
  cw_ptxas channelwise $O/cw_state/s1.log $O/cw_state/s2.log
}

run_cw_diag() {  # Sec. 41: where K1 / K2 go wrong (diag_grad.py: probes x variants x slabs)
  mkdir -p $O/cw_diag; local s=$SECONDS
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 190 python3 benchmarks/diag_grad.py --deadline_s=170 \
    --out=$O/cw_diag/diag > $O/cw_diag/diag.log 2>&1; echo "diag rc=$? t=$((SECONDS-s))s"
  grep -a -h ' PASS ' $O/cw_diag/diag.log | awk '{print $2}' | sort | uniq -c | tr '\n' ' '
  echo "(PASS lines per variant; the FAIL, compile, skip and error lines follow)"
  grep -a -h '^diag ' $O/cw_diag/diag.log | grep -v ' PASS ' | cut -c1-300 | head -160
  grep -a -h -E '^  at k[12]@16 ' $O/cw_diag/diag.log | cut -c1-420 | head -80
  cw_ptxas channelwise_grad $O/cw_diag/diag.log
}

run_cw_grad() {
  mkdir -p $O/cw_grad; local s=$SECONDS
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 200 python3 benchmarks/bench_kernels.py --ops=kda --peers=ours \
    --passes=fwdbwd --shapes=S1 --channelwise_grad_pass=mosaic_fused,triton,mosaic \
    --breakdown_top=16 --iters=30 --warmup=5 --out=$O/cw_grad/kda > $O/cw_grad/kda.log 2>&1
  echo "bench rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/cw_grad/kda.log | cut -c1-300
  cw_show $O/cw_grad/kda.log
  cw_ptxas channelwise $O/cw_grad/kda.log
}

run_cw_tests() {
  mkdir -p $O/cw_tests; local s=$SECONDS
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 300 python3 benchmarks/gpu_tests.py --jobs=11 --deadline_s=270 \
    --out=$O/cw_tests/gpu_tests $T/kernel_mosaic_channelwise_test.py::GpuTest \
    $T/kernel_mosaic_channelwise_grad_chunk_test.py::GpuTest \
    $T/kernel_mosaic_channelwise_grad_test.py::GpuTest
  echo "gpu tests rc=$? t=$((SECONDS-s))s"
  cut -c1-220 $O/cw_tests/gpu_tests/summary.md | tail -50
}

run_cw_gdn2() {
  mkdir -p $O/cw_gdn2; local s=$SECONDS
  local b="python3 benchmarks/bench_kernels.py --ops=gdn2 --shapes=S1 --breakdown_top=16"
  b="$b --iters=30 --warmup=5"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 150 $b --peers=ours,jla --passes=fwdbwd,fwd \
    --channelwise_state_pass=mosaic,triton --out=$O/cw_gdn2/state > $O/cw_gdn2/state.log 2>&1
  echo "state rc=$? t=$((SECONDS-s))s"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout $((290 - SECONDS + s)) $b --peers=ours --passes=fwdbwd \
    --channelwise_grad_pass=mosaic_fused,triton --out=$O/cw_gdn2/grad > $O/cw_gdn2/grad.log 2>&1
  echo "grad rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/cw_gdn2/state.log $O/cw_gdn2/grad.log | cut -c1-300
  cw_show $O/cw_gdn2/state.log $O/cw_gdn2/grad.log
  cw_ptxas channelwise $O/cw_gdn2/state.log $O/cw_gdn2/grad.log
}

run_cw_slab() {
  mkdir -p $O/cw_slab; local s=$SECONDS
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 150 python3 benchmarks/profile_grad.py --deadline_s=140 \
    --variants=k2,k1 --slabs=16,32 --out=$O/cw_slab/slabs > $O/cw_slab/slabs.log 2>&1
  echo "rc=$? t=$((SECONDS-s))s"
  cw_ptxas channelwise_grad $O/cw_slab/slabs.log
  grep -a -h -E '^\| ' $O/cw_slab/slabs.md | cut -c1-200
}
tab_show() {  # one line per record: op shape pass peer gate kernel_ms wall_ms t_s, top kernels
  cat "$@" | python3 -c 'import sys,json
for l in sys.stdin:
  if not l.startswith("{\"peer\""): continue
  r=json.loads(l); k=r.get("kernels") or {}
  top={n[:40]:round(v,3) for n,v in list(k.items())[:7]}
  print(r["op"],r["shape"],r["pass_"],r["peer"],"gate" if r.get("gate") else "RED",
        r.get("kernel_ms") and round(r["kernel_ms"],3),r.get("ms") and round(r["ms"],3),
        "t="+str(r.get("t_s")),r.get("error","")[:120],top)' | cut -c1-420
}

run_tab() {  # run_tab <op> <peers> <limit_s> [dir [bench flag ...]]: S1, S2, P1, one bench
  # process each (both peers of a shape in the same process), within limit_s in all
  local op=$1 peers=$2 lim=$3 s=$SECONDS sh left d=$O/tab_${4:-$1}
  shift 3; shift $(($# > 0 ? 1 : 0))
  mkdir -p $d
  for sh in S1 S2 P1; do
    left=$((lim - SECONDS + s))
    [ $left -ge 40 ] || { echo "tab $op $sh: ${left}s left, not run"; continue; }
    timeout $left python3 benchmarks/bench_kernels.py --ops=$op --peers=$peers \
      --passes=fwdbwd,fwd --shapes=$sh --breakdown_top=16 --iters=30 --warmup=5 "$@" \
      --out=$d/$sh > $d/$sh.log 2>&1; echo "tab $op $sh rc=$? t=$((SECONDS-s))s"
  done
  grep -a -h '^gate' $d/*.log | sort -u | cut -c1-300
  tab_show $d/*.jsonl
  python3 benchmarks/acceptance.py $d/*.jsonl
  # DeltaNet's ours is the Triton kernels while it is in AUTO_OFF: the Mosaic op's verdicts too
  [ $op != deltanet ] && [ $# = 0 ] || python3 benchmarks/acceptance.py --ours=mosaic $d/*.jsonl
}

run_tab_gdn() { run_tab gdn ours,jla 330; }
run_tab_dn() { run_tab deltanet mosaic,ours,jla 450; }
run_tab_lgt() { run_tab lightning ours,jla 330; }
run_tab_kda() { run_tab kda ours,jla 330; }
run_tab_gdn2() { run_tab gdn2 ours,jla 330; }
run_lgt_fused() { run_tab lightning ours,mosaic,jla 450 lgtf --mosaic_forward=fused; }
run_lgt_ftests() {  # the fused forward's gpu tests (never run on a GPU before)
  mkdir -p $O/lgt_ftests; local s=$SECONDS
  timeout 190 python3 -m pytest -q -m gpu -p no:cacheprovider \
    $T/kernel_mosaic_gpu_fused_test.py > $O/lgt_ftests/tests.log 2>&1
  echo "rc=$? t=$((SECONDS-s))s"; tail -25 $O/lgt_ftests/tests.log | cut -c1-300
}

run_tab_fla() {  # the table's fla column, all five ops (fla's own autotuned configurations)
  mkdir -p $O/tab_fla
  timeout 490 python3 benchmarks/bench_kernels.py --ops=gdn,deltanet,lightning,kda,gdn2 \
    --peers=fla --passes=fwdbwd,fwd --shapes=S1,S2,P1 --iters=30 --warmup=5 \
    --fla_autotune_cache=/tmp/flacache --out=$O/tab_fla/fla > $O/tab_fla/fla.log 2>&1
  echo "fla rc=$?"; grep -a -h -i 'fla worker failed' -A3 $O/tab_fla/fla.log | cut -c1-300
  tab_show $O/tab_fla/fla.jsonl
  python3 benchmarks/acceptance.py $O/tab_*/*.jsonl
}
run_dhw() {  # Sec. 51: dh_w="t0" (+fold+t0w) against the stored W (+fold), one process, S1
  mkdir -p $O/dhw; local s=$SECONDS
  timeout 200 python3 benchmarks/bench_kernels.py --ops=gdn --peers=mosaic,jla --passes=fwdbwd \
    --shapes=S1 --mosaic_backward=fused_ws+fold,fused_ws+fold+t0w --breakdown_top=16 \
    --iters=30 --warmup=5 --out=$O/dhw/gdn > $O/dhw/gdn.log 2>&1
  echo "bench rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/dhw/gdn.log | cut -c1-300
  grep -a -h -o '"mosaic_backward": "[^"]*"\|"mosaic_dh_w_run": "[^"]*"' $O/dhw/gdn.log | paste - -
  gdn_show $O/dhw/gdn.log
  timeout $((410 - SECONDS + s)) python3 -m pytest -m gpu -q -p no:cacheprovider -s \
    -k "w_from_t0 or dh_w_t0" $T/kernel_mosaic_gdn_dh_fold_test.py \
    $T/kernel_mosaic_gdn_vjp_test.py > $O/dhw/tests.log 2>&1
  echo "gpu tests rc=$? t=$((SECONDS-s))s"
  grep -a -E 'vs stored|passed|failed|FAILED|Error' $O/dhw/tests.log | cut -c1-200 | tail -40
}
run_mix() {  # for a short budget: Lightning's fused forward (Sec. 50) at S1 and P1 beside the
  # two-pass op and jla, then dhw's bench (Sec. 51, S1) without its gpu tests
  mkdir -p $O/mix; local s=$SECONDS sh
  for sh in S1 P1; do
    timeout 150 python3 benchmarks/bench_kernels.py --ops=lightning --peers=ours,mosaic,jla \
      --mosaic_forward=fused --passes=fwdbwd,fwd --shapes=$sh --breakdown_top=16 --iters=30 \
      --warmup=5 --out=$O/mix/lgt_$sh > $O/mix/lgt_$sh.log 2>&1
    echo "lightning $sh rc=$? t=$((SECONDS-s))s"
  done
  grep -a -h '^gate' $O/mix/lgt_*.log | sort -u | cut -c1-300
  tab_show $O/mix/lgt_*.jsonl
  python3 benchmarks/acceptance.py --ours=mosaic $O/mix/lgt_*.jsonl
  timeout 160 python3 benchmarks/bench_kernels.py --ops=gdn --peers=mosaic,jla --passes=fwdbwd \
    --shapes=S1 --mosaic_backward=fused_ws+fold,fused_ws+fold+t0w --breakdown_top=16 \
    --iters=30 --warmup=5 --out=$O/mix/dhw > $O/mix/dhw.log 2>&1
  echo "dhw bench rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/mix/dhw.log | cut -c1-300
  gdn_show $O/mix/dhw.log
}
run_pskip() {  # Sec. 52: sequence pieces skip what a document start cuts, on and off
  mkdir -p $O/pskip; local s=$SECONDS
  timeout 150 python3 benchmarks/bench_kernels.py --ops=gdn --peers=mosaic,jla \
    --passes=fwdbwd,fwd --shapes=P1,S2 --mosaic_piece_skip --breakdown_top=16 --iters=30 \
    --warmup=5 --out=$O/pskip/on > $O/pskip/on.log 2>&1
  echo "skip on rc=$? t=$((SECONDS-s))s"
  timeout 120 python3 benchmarks/bench_kernels.py --ops=gdn --peers=mosaic \
    --passes=fwdbwd,fwd --shapes=P1,S2 --nomosaic_piece_skip --breakdown_top=16 --iters=30 \
    --warmup=5 --out=$O/pskip/off > $O/pskip/off.log 2>&1
  echo "skip off rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/pskip/*.log | cut -c1-300
  tab_show $O/pskip/*.jsonl
  timeout $((410 - SECONDS + s)) python3 -m pytest -m gpu -q -p no:cacheprovider \
    $T/kernel_mosaic_gdn_piece_skip_test.py > $O/pskip/tests.log 2>&1
  echo "gpu tests rc=$? t=$((SECONDS-s))s"; tail -15 $O/pskip/tests.log | cut -c1-300
}
run_lgt_rh() {  # Sec. 54: the fused forward's h as the backward's residual, on and off
  mkdir -p $O/lgt_rh; local s=$SECONDS
  timeout 160 python3 benchmarks/bench_kernels.py --ops=lightning --peers=ours,mosaic,jla \
    --passes=fwdbwd --shapes=S1,P1 --mosaic_forward=fused --mosaic_gla_residual_h \
    --breakdown_top=16 --iters=30 --warmup=5 --out=$O/lgt_rh/on > $O/lgt_rh/on.log 2>&1
  echo "residual h rc=$? t=$((SECONDS-s))s"
  timeout 130 python3 benchmarks/bench_kernels.py --ops=lightning --peers=mosaic \
    --passes=fwdbwd --shapes=S1,P1 --mosaic_forward=fused --breakdown_top=16 --iters=30 \
    --warmup=5 --out=$O/lgt_rh/off > $O/lgt_rh/off.log 2>&1
  echo "recomputed h rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/lgt_rh/*.log | cut -c1-300
  tab_show $O/lgt_rh/*.jsonl
  timeout $((390 - SECONDS + s)) python3 -m pytest -m gpu -q -p no:cacheprovider \
    -k residual_h $T/kernel_mosaic_gpu_fused_test.py > $O/lgt_rh/tests.log 2>&1
  echo "gpu tests rc=$? t=$((SECONDS-s))s"; tail -15 $O/lgt_rh/tests.log | cut -c1-300
}
run_lgt_st() {  # Sec. 55: the fused forward's TMA ring, 3 stages against 2, one process a shape
  mkdir -p $O/lgt_st; local s=$SECONDS sh
  for sh in S1 P1; do
    timeout 155 python3 benchmarks/bench_kernels.py --ops=lightning --peers=ours,mosaic,jla \
      --mosaic_forward=fused --mosaic_gla_stages=3 --passes=fwd,fwdbwd --shapes=$sh \
      --breakdown_top=16 --iters=30 --warmup=5 --out=$O/lgt_st/$sh > $O/lgt_st/$sh.log 2>&1
    echo "lightning $sh rc=$? t=$((SECONDS-s))s"
  done
  grep -a -h '^gate' $O/lgt_st/*.log | sort -u | cut -c1-300
  tab_show $O/lgt_st/*.jsonl
  python3 benchmarks/acceptance.py --ours=mosaic $O/lgt_st/*.jsonl
}
run_rs() {  # Sec. 56: fused_rs against fused_t0 (ours) and jla at S1 fwd, then 2 stages, tests
  mkdir -p $O/rs; local s=$SECONDS
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 200 python3 benchmarks/bench_kernels.py --ops=gdn \
    --peers=jla,ours,mosaic --mosaic_forward=fused_rs --passes=fwd --shapes=S1 \
    --breakdown_top=16 --iters=30 --warmup=5 --out=$O/rs/s1 \
    > $O/rs/s1.log 2>&1
  echo "S1 jla,ours,fused_rs rc=$? t=$((SECONDS-s))s"
  timeout 120 python3 benchmarks/bench_kernels.py --ops=gdn --peers=mosaic \
    --mosaic_forward=fused_rs --mosaic_rs_stages=2 --passes=fwd --shapes=S1 \
    --breakdown_top=16 --iters=30 --warmup=5 --out=$O/rs/s1_st2 \
    > $O/rs/s1_st2.log 2>&1
  echo "S1 fused_rs 2 stages rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/rs/*.log | cut -c1-300
  grep -a -h -E 'fused_rs.*(egisters|spill)|(egisters|spill).*fused_rs' $O/rs/s1.log | sort -u \
    | head -4 | cut -c1-300
  grep -a -h -o '"mosaic_forward_run": "[^"]*"\|"mosaic_rs_stages": [^,]*' $O/rs/*.log | paste - -
  gdn_show $O/rs/*.log
  timeout $((540 - SECONDS + s)) python3 -m pytest -m gpu -q -p no:cacheprovider -s \
    $T/kernel_mosaic_gdn_rs_test.py > $O/rs/tests.log 2>&1
  echo "gpu tests rc=$? t=$((SECONDS-s))s"
  grep -a -E 'fused_rs|passed|failed|FAILED|Error' $O/rs/tests.log | cut -c1-250 | tail -30
}
run_rs_prof() {  # Sec. 56: where fused_rs's time goes (state alone, read-out alone, full), S1
  mkdir -p $O/rs_prof; local s=$SECONDS
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 100 python3 benchmarks/profile_fwd.py --rs_stages=3 \
    --variants=state,readout,full --deadline_s=90 --out=$O/rs_prof/rs > $O/rs_prof/rs.log 2>&1
  echo "fused_rs ablations rc=$? t=$((SECONDS-s))s"
  timeout 60 python3 benchmarks/profile_fwd.py --variants=full --deadline_s=50 \
    --out=$O/rs_prof/t0 > $O/rs_prof/t0.log 2>&1
  echo "fused_t0 full rc=$? t=$((SECONDS-s))s"
  grep -a -h -E '^\| ' $O/rs_prof/*.md | cut -c1-220
  grep -a -h -E 'fused_rs.*(egisters|spill)|(egisters|spill).*fused_rs' $O/rs_prof/rs.log \
    | sort -u | head -6 | cut -c1-300
}
run_rs_proto() {  # Sec. 64: fused_rs's protocol ag_ahead against joint at S1 fwd, jla beside
  mkdir -p $O/rs_proto; local s=$SECONDS
  local b="python3 benchmarks/bench_kernels.py --ops=gdn --mosaic_forward=fused_rs --passes=fwd"
  b="$b --shapes=S1 --breakdown_top=16 --iters=30 --warmup=5"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 150 $b --peers=jla,mosaic --out=$O/rs_proto/joint \
    > $O/rs_proto/joint.log 2>&1
  echo "S1 jla,fused_rs joint (2 stages) rc=$? t=$((SECONDS-s))s"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 110 $b --peers=jla,mosaic --mosaic_rs_protocol=ag_ahead \
    --mosaic_rs_stages=3 --out=$O/rs_proto/ah3 > $O/rs_proto/ah3.log 2>&1
  echo "S1 jla,fused_rs ag_ahead 3 stages rc=$? t=$((SECONDS-s))s"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 90 $b --peers=mosaic --mosaic_rs_protocol=ag_ahead \
    --mosaic_rs_stages=2 --out=$O/rs_proto/ah2 > $O/rs_proto/ah2.log 2>&1
  echo "S1 fused_rs ag_ahead 2 stages rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/rs_proto/*.log | cut -c1-300
  grep -a -h -E 'fused_rs.*(egisters|spill)|(egisters|spill).*fused_rs' $O/rs_proto/*.log \
    | sort -u | head -6 | cut -c1-300
  grep -a -h -o '"mosaic_rs_stages": [^,]*\|"mosaic_rs_protocol": "[^"]*"' $O/rs_proto/*.log \
    | paste - -
  gdn_show $O/rs_proto/*.log
  timeout 100 python3 benchmarks/profile_fwd.py --rs_stages=3 --rs_protocol=ag_ahead \
    --variants=state,readout,full --deadline_s=90 --out=$O/rs_proto/prof \
    > $O/rs_proto/prof.log 2>&1
  echo "ag_ahead ablations rc=$? t=$((SECONDS-s))s"
  grep -a -h -E '^\| ' $O/rs_proto/prof.md | cut -c1-220
  timeout $((550 - SECONDS + s)) python3 -m pytest -m gpu -q -p no:cacheprovider -s \
    $T/kernel_mosaic_gdn_rs_test.py > $O/rs_proto/tests.log 2>&1
  echo "gpu tests rc=$? t=$((SECONDS-s))s"
  grep -a -E 'fused_rs|passed|failed|FAILED|Error' $O/rs_proto/tests.log | cut -c1-250 | tail -30
}
run_mapsx() {  # Sec. 57: M_p and X_p in one launch (no summary launch), on and off, + skip
  mkdir -p $O/mapsx; local s=$SECONDS
  timeout 160 python3 benchmarks/bench_kernels.py --ops=gdn --peers=mosaic,jla \
    --passes=fwdbwd,fwd --shapes=S2,P1 --mosaic_maps_carry_x --breakdown_top=16 --iters=30 \
    --warmup=5 --out=$O/mapsx/on > $O/mapsx/on.log 2>&1
  echo "carry x on rc=$? t=$((SECONDS-s))s"
  timeout 120 python3 benchmarks/bench_kernels.py --ops=gdn --peers=mosaic \
    --passes=fwdbwd,fwd --shapes=S2,P1 --nomosaic_maps_carry_x --breakdown_top=16 --iters=30 \
    --warmup=5 --out=$O/mapsx/off > $O/mapsx/off.log 2>&1
  echo "carry x off rc=$? t=$((SECONDS-s))s"
  timeout 100 python3 benchmarks/bench_kernels.py --ops=gdn --peers=mosaic \
    --passes=fwdbwd,fwd --shapes=P1 --mosaic_maps_carry_x --mosaic_piece_skip \
    --breakdown_top=16 --iters=30 --warmup=5 --out=$O/mapsx/skip > $O/mapsx/skip.log 2>&1
  echo "carry x + piece skip rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/mapsx/*.log | cut -c1-300
  grep -a -h -o '"mosaic_maps_carry_x": [a-z]*\|"mosaic_piece_skip": [a-z]*' $O/mapsx/*.log \
    | sort | uniq -c
  tab_show $O/mapsx/*.jsonl
  timeout $((530 - SECONDS + s)) python3 -m pytest -m gpu -q -p no:cacheprovider \
    $T/kernel_mosaic_gdn_maps_x_test.py > $O/mapsx/tests.log 2>&1
  echo "gpu tests rc=$? t=$((SECONDS-s))s"; tail -15 $O/mapsx/tests.log | cut -c1-300
}
run_rs_res() {  # Sec. 58: fused_rs's residual form on (RS_RESIDUALS) against off (fused_t0) at
  # S1 fwd+bwd, both backwards (stored W, dh_w="t0"), jla in each process; then its gpu tests
  mkdir -p $O/rs_res; local s=$SECONDS
  local args="--ops=gdn --peers=mosaic,jla --mosaic_forward=fused_rs --passes=fwdbwd --shapes=S1
    --mosaic_backward=fused_ws+fold,fused_ws+fold+t0w --breakdown_top=16
    --iters=30 --warmup=5"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 185 python3 benchmarks/bench_kernels.py $args \
    --mosaic_rs_residuals --out=$O/rs_res/on > $O/rs_res/on.log 2>&1
  echo "S1 fwdbwd residual form on rc=$? t=$((SECONDS-s))s"
  timeout 185 python3 benchmarks/bench_kernels.py $args --out=$O/rs_res/off \
    > $O/rs_res/off.log 2>&1
  echo "S1 fwdbwd residual form off (fused_t0) rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/rs_res/*.log | cut -c1-300
  grep -a -h -E 'fused_rs.*(egisters|spill)|(egisters|spill).*fused_rs' $O/rs_res/on.log \
    | sort -u | head -4 | cut -c1-300
  grep -a -h -o '"mosaic_forward_run": "[^"]*"\|"mosaic_rs_residuals": [a-z]*' $O/rs_res/*.log \
    | paste - -
  grep -a -h -o '"mosaic_backward": "[^"]*"\|"mosaic_dh_w_run": "[^"]*"' $O/rs_res/*.log \
    | paste - -
  gdn_show $O/rs_res/*.log
  timeout $((535 - SECONDS + s)) python3 -m pytest -m gpu -q -p no:cacheprovider -s \
    -k "residuals" $T/kernel_mosaic_gdn_rs_test.py > $O/rs_res/tests.log 2>&1
  echo "gpu tests rc=$? t=$((SECONDS-s))s"
  grep -a -E 'fused_rs|passed|failed|FAILED|Error' $O/rs_res/tests.log | cut -c1-250 | tail -30
}
run_rs_res_st() {  # Sec. 58.5: residual_from="state" at S1 fwd+bwd (both backwards), jla beside
  mkdir -p $O/rs_res_st; local s=$SECONDS
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 185 python3 benchmarks/bench_kernels.py --ops=gdn \
    --peers=mosaic,jla --mosaic_forward=fused_rs --passes=fwdbwd --shapes=S1 \
    --mosaic_backward=fused_ws+fold,fused_ws+fold+t0w --breakdown_top=16 \
    --iters=30 --warmup=5 --mosaic_rs_residuals --mosaic_rs_residual_from=state \
    --out=$O/rs_res_st/on > $O/rs_res_st/on.log 2>&1
  echo "S1 fwdbwd residual form (state) rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/rs_res_st/*.log | cut -c1-300
  grep -a -h -E 'fused_rs.*(egisters|spill)|(egisters|spill).*fused_rs' $O/rs_res_st/on.log \
    | sort -u | head -4 | cut -c1-300
  grep -a -h -o '"mosaic_backward": "[^"]*"\|"mosaic_dh_w_run": "[^"]*"' $O/rs_res_st/*.log \
    | paste - -
  gdn_show $O/rs_res_st/*.log
  timeout $((290 - SECONDS + s)) python3 -m pytest -m gpu -q -p no:cacheprovider -s \
    -k "residuals_from_state" $T/kernel_mosaic_gdn_rs_test.py > $O/rs_res_st/tests.log 2>&1
  echo "gpu tests rc=$? t=$((SECONDS-s))s"
  grep -a -E 'passed|failed|FAILED|Error' $O/rs_res_st/tests.log | cut -c1-250 | tail -10
}
run_rs_pieces() {  # Sec. 60: fused_rs on S2/P1's sequence pieces, on (jla beside) and off
  mkdir -p $O/rs_pieces; local s=$SECONDS
  local args="--ops=gdn --mosaic_forward=fused_rs --mosaic_rs_residuals --passes=fwd,fwdbwd
    --shapes=S2,P1 --breakdown_top=16 --iters=30 --warmup=5"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 190 python3 benchmarks/bench_kernels.py $args \
    --peers=mosaic,jla --mosaic_rs_pieces --out=$O/rs_pieces/on > $O/rs_pieces/on.log 2>&1
  echo "S2,P1 fused_rs pieces on rc=$? t=$((SECONDS-s))s"
  timeout 150 python3 benchmarks/bench_kernels.py $args --peers=mosaic --nomosaic_rs_pieces \
    --out=$O/rs_pieces/off > $O/rs_pieces/off.log 2>&1
  echo "S2,P1 fused_rs pieces off (fused_t0's pieces) rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/rs_pieces/*.log | cut -c1-300
  grep -a -h -E 'fused_rs.*(egisters|spill)|(egisters|spill).*fused_rs' $O/rs_pieces/on.log \
    | sort -u | head -4 | cut -c1-300
  grep -a -h -o '"mosaic_forward_run": "[^"]*"\|"mosaic_pieces_run": [0-9]*' \
    $O/rs_pieces/*.log | paste - - | sort | uniq -c
  tab_show $O/rs_pieces/*.jsonl
  gdn_show $O/rs_pieces/*.log
  timeout $((510 - SECONDS + s)) python3 -m pytest -m gpu -q -p no:cacheprovider -s \
    $T/kernel_mosaic_gdn_rs_pieces_test.py > $O/rs_pieces/tests.log 2>&1
  echo "gpu tests rc=$? t=$((SECONDS-s))s"
  grep -a -E 'fused_rs|passed|failed|FAILED|Error' $O/rs_pieces/tests.log | cut -c1-250 | tail -20
}
run_kda_local() {  # Sec. 62: KDA's chunk-local forward as one Mosaic GPU kernel, off and on
  mkdir -p $O/kda_local; local s=$SECONDS
  timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider -s \
    $T/kernel_mosaic_channelwise_local_test.py > $O/kda_local/tests.log 2>&1
  echo "gpu tests rc=$? t=$((SECONDS-s))s"
  grep -a -E 'passed|failed|FAILED|Error' $O/kda_local/tests.log | cut -c1-250 | tail -12
  local args="--ops=kda --peers=ours,jla --passes=fwd,fwdbwd --shapes=S1,S2 --breakdown_top=16
    --iters=30 --warmup=5"
  timeout 165 python3 benchmarks/bench_kernels.py $args --out=$O/kda_local/off \
    > $O/kda_local/off.log 2>&1; echo "chunk_local off rc=$? t=$((SECONDS-s))s"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 165 python3 benchmarks/bench_kernels.py $args \
    --tuning='{"channelwise": {"chunk_local": "mosaic"}}' --out=$O/kda_local/on \
    > $O/kda_local/on.log 2>&1; echo "chunk_local on rc=$? t=$((SECONDS-s))s"
  grep -a -h '^gate' $O/kda_local/*.log | cut -c1-300
  cw_show $O/kda_local/off.log $O/kda_local/on.log
  cw_ptxas channelwise_local $O/kda_local/on.log
}
# ---- end of Sec. 37's items -------------------------------------------------------------------

{
  echo "issue29 queue at $(git rev-parse --short HEAD 2>/dev/null) (code $CODE) budget ${B}s" \
    "items: $ITEMS; setup ${SETUP_S}s"
  nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
  for it in $ITEMS; do
    [ -f $I/i29done/$it ] && { echo "== $it: done earlier on this machine"; continue; }
    e=$(est $it); left=$((B - SECONDS - 15))
    [ $e -le $left ] || { echo "== $it: needs ${e}s, ${left}s left (setup took ${SETUP_S}s of" \
      "the budget); skipped"; continue; }
    echo "== $it (estimate ${e}s) at ${SECONDS}s"
    run_$it; touch $I/i29done/$it
    echo "== $it ended at ${SECONDS}s"
  done
} 2>&1 | tee $LOG
rm -f $O/*/gpu_tests/worker-*
mkdir -p $OUT && tar czf $OUT/i29-$STAMP.tar.gz -C $I/i29out $STAMP && cp $LOG $OUT/i29.log
ls -la $OUT
