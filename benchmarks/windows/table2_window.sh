#!/usr/bin/env bash
# Issue 28's GPU window (the script of pages paper1-sweeps-2026-12-05d and -05f). Usage, on the
# device machine from the repository root:
#   [PHASES="ps t7 tp t2"] [T2_ONLY="--only=..."] [T2_ARG=...] [EXTRA2=...] [EXTRA7=...] \
#     [EXTRAP=...] \
#     bash benchmarks/windows/table2_window.sh <budget_s>
# The first call of a fresh machine joins the corpus (pieces 000 and 001 copied to /tmp/pieces
# by two earlier calls; carry piece 002, the manifest and .whl) and restores the record folders
# from sweeps/*/records.tar.gz. Phases (PHASES, default "t2"), each only while time is left:
# ps = the matched-parameter GDN-2 runs (configs/sweeps/params_small.py); t7 = Table 7 core
# (host reused from table2, CLVR x 2 seeds); tp = train_throughput.py --size=small one preset at
# a time into /tmp/tp; t2 = Table 2's runs that T2_ONLY selects (default: the seed-43 runs
# that the report's Seeds section asked for after window 11, 2026-12-06d: GDN-2; finished ones are
# skipped). EXTRA2, EXTRA7, EXTRAP: more flags of the t2, t7 and ps sweeps; EXTRA2:
# "--finish_by_deadline --stop_margin_s=5" on the last call,
# "--gpus=0,1,2,3" on a 4-GPU host; T2_ARG=",seeds=2" (default) puts every group's seed 43 in
# the grid. The records of each sweep (sweeps/<t>/) go to /tmp/sweeps/<t> when that folder does
# not exist yet, also when the corpus was joined by hand: a sweep root without them would export
# only this window's runs, and copying that export over sweeps/<t>/ would lose the others.
# WINDOW_TMP (default /tmp) moves every /tmp path (tests). Exit status: the last sweep's
# (0 done, 3 stopped at the deadline, 4 a run failed), 6 when the corpus pieces are missing,
# 5 when the join fails, 2 (and this text) for a budget that is not a number, e.g. --help.
PHASES=${PHASES:-t2}
T2_ONLY=${T2_ONLY:---only=arch=gdn2,stack=hybrid,opt=muon,seed=43 --only=arch=gdn2,stack=hybrid,opt=adamw,seed=43 --only=arch=gdn2,stack=pure,opt=muon,seed=43 --only=arch=gdn2,stack=pure,opt=adamw,seed=43}
T2_ARG=${T2_ARG-,seeds=2}
B=${1:-565}
[[ "$B" =~ ^[0-9]+$ ]] || { sed -n '2,/^PHASES=/p' "$0" | sed '$d' | cut -c3- >&2; echo "table2_window: <budget_s> is a whole number of seconds, not '$B'" >&2; exit 2; }
W=${WINDOW_TMP:-/tmp}
export PYTHONPATH=$W/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
if [ ! -d $W/corpus/prose-llama2 ]; then
  for k in 000 001; do
    [ -f $W/pieces/prose-llama2.tar.xz.$k ] || { echo "table2_window: no $W/pieces/prose-llama2.tar.xz.$k: copy pieces 000 and 001 there in two earlier calls (BUILD.md, \"Moving a corpus to a machine without registries\")" >&2; exit 6; }
  done
  cp .corpus_pieces/prose-llama2/prose-llama2.tar.xz.002 .corpus_pieces/prose-llama2/prose-llama2.pieces.json $W/pieces/ || { echo "table2_window: carry .corpus_pieces/prose-llama2/prose-llama2.tar.xz.002 and prose-llama2.pieces.json in this call" >&2; exit 6; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $W/site .whl/*.whl
  python3 experiments/corpus_pieces.py --mode=join --manifest=$W/pieces/prose-llama2.pieces.json --output_dir=$W/corpus || exit 5
  echo "joined at ${SECONDS}s"
fi
for t in lr_scan table2 table7 params; do
  [ -e $W/sweeps/$t ] && continue  # restored by an earlier call (or in use): never again
  mkdir -p $W/sweeps/$t && { [ ! -f sweeps/$t/records.tar.gz ] || tar xzf sweeps/$t/records.tar.gz -C $W/sweeps/$t; } && { [ ! -f sweeps/$t/sweep.jsonl ] || cp sweeps/$t/sweep.jsonl $W/sweeps/$t/; } && echo "restored sweeps/$t into $W/sweeps/$t"
done
C=corpus=$W/corpus/prose-llama2,rates_from=sweeps/lr_scan/results.json
COMMON="--compilation_cache=$W/jaxcache --min_run_s=90"
rc=0
if [[ " $PHASES " == *" t7 "* ]] && [ ! -f $W/t7.done ]; then
  python3 experiments/sweep.py --config=configs/sweeps/table7_small.py:$C --root=$W/sweeps/table7 $COMMON \
    --reuse_from=$W/sweeps/table2 --only=route=clvr --only=route=none ${EXTRA7:-} \
    --deadline_s=$((B-SECONDS)) --export=$OUT/table7; rc=$?
  echo "table7 rc=$rc at ${SECONDS}s"; [ $rc = 0 ] && touch $W/t7.done
fi
[ $rc = 0 ] || exit $rc
mkdir -p $W/tp
[[ " $PHASES " == *" tp "* ]] && for p in softmax_dense gdn_pure gdn_hybrid kda_hybrid deltanet_pure deltanet_hybrid kda_pure gdn2_pure gdn2_hybrid; do
  python3 -c "import json,sys; sys.exit(0 if '$p' in json.load(open('$W/tp/train_throughput.json'))['runs'] else 1)" 2>/dev/null && continue
  left=$((B-SECONDS-10)); [ $left -gt 75 ] || { echo "throughput: no time for $p"; rc=3; break; }
  timeout $left python3 benchmarks/train_throughput.py --out=$W/tp --size=small --batch_size=16 \
    --corpus=$W/corpus/prose-llama2 --presets=$p --steps=120 --opt=adamw > $W/tp/$p.log 2>&1
  echo "throughput $p rc=$? at ${SECONDS}s"; tail -3 $W/tp/$p.log
done
[[ " $PHASES " == *" tp "* ]] && mkdir -p $OUT/tp && cp $W/tp/train_throughput.* $OUT/tp/
[ $rc = 0 ] || exit $rc
if [[ " $PHASES " == *" ps "* ]] && [ $((B-SECONDS)) -gt 150 ]; then
  python3 experiments/sweep.py --config=configs/sweeps/params_small.py:$C --root=$W/sweeps/params \
    $COMMON --reuse_from=$W/sweeps/table2 ${EXTRAP:-} --deadline_s=$((B-SECONDS)) \
    --export=$OUT/params; rc=$?
  echo "params rc=$rc at ${SECONDS}s"
fi
[ $rc = 0 ] || exit $rc
if [[ " $PHASES " == *" t2 "* ]] && [ $((B-SECONDS)) -gt 150 ]; then
  python3 experiments/sweep.py --config=configs/sweeps/table2_small.py:$C${T2_ARG:-} --root=$W/sweeps/table2 $COMMON \
    $T2_ONLY ${EXTRA2:-} --deadline_s=$((B-SECONDS)) --export=$OUT/table2; rc=$?
  echo "table2 rc=$rc at ${SECONDS}s"
elif [[ " $PHASES " == *" t2 "* ]]; then
  echo "table2: not started, $((B-SECONDS)) s left of the budget (needs > 150)"
fi
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
exit $rc
