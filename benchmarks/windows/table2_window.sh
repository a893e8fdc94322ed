#!/usr/bin/env bash
# Issue 28's GPU window (the script of pages paper1-sweeps-2026-12-05d and -05f). Usage, on the
# device machine from the repository root:
#   [PHASES="ps t7 tp t2"] [T2_ONLY="--only=..."] [T2_ARG=...] [EXTRA2=...] [EXTRA7=...] \
#     bash benchmarks/windows/table2_window.sh <budget_s>
# The first call of a fresh machine joins the corpus (pieces 000 and 001 copied to /tmp/pieces
# by two earlier calls; carry piece 002, the manifest and .whl) and restores the record folders
# from sweeps/*/records.tar.gz. Phases (PHASES, default "t2"), each only while time is left:
# ps = the matched-parameter GDN-2 runs (configs/sweeps/params_small.py); t7 = Table 7 core
# (host reused from table2, CLVR x 2 seeds); tp = train_throughput.py --size=small one preset at
# a time into /tmp/tp; t2 = Table 2's runs that T2_ONLY selects (default: the seed-43 runs
# that the report's Seeds section asked for after window 10, 2026-12-06c; finished ones are
# skipped). EXTRA2: "--finish_by_deadline --stop_margin_s=5" on the last call,
# "--gpus=0,1,2,3" on a 4-GPU host; T2_ARG=",seeds=2" (default) puts every group's seed 43 in
# the grid.
PHASES=${PHASES:-t2}
T2_ONLY=${T2_ONLY:---only=arch=kda,stack=hybrid,opt=muon,seed=43 --only=arch=gdn2,stack=hybrid,opt=muon,seed=43 --only=arch=gdn2,stack=hybrid,opt=adamw,seed=43 --only=arch=kda,stack=pure,opt=muon,seed=43 --only=arch=gdn2,stack=pure,opt=muon,seed=43 --only=arch=gdn2,stack=pure,opt=adamw,seed=43 --only=arch=deltanet,stack=pure,opt=muon,seed=43}
T2_ARG=${T2_ARG-,seeds=2}
B=${1:-565}
export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
if [ ! -d /tmp/corpus/prose-llama2 ]; then
  [ -f /tmp/pieces/prose-llama2.tar.xz.000 ] && [ -f /tmp/pieces/prose-llama2.tar.xz.001 ] || exit 4
  cp .corpus_pieces/prose-llama2/prose-llama2.tar.xz.002 .corpus_pieces/prose-llama2/prose-llama2.pieces.json /tmp/pieces/ || exit 4
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  python3 experiments/corpus_pieces.py --mode=join --manifest=/tmp/pieces/prose-llama2.pieces.json --output_dir=/tmp/corpus || exit 5
  for t in lr_scan table2 table7 params; do mkdir -p /tmp/sweeps/$t && { [ ! -f sweeps/$t/records.tar.gz ] || tar xzf sweeps/$t/records.tar.gz -C /tmp/sweeps/$t; } && { [ ! -f sweeps/$t/sweep.jsonl ] || cp sweeps/$t/sweep.jsonl /tmp/sweeps/$t/; }; done
  echo "joined at ${SECONDS}s"
fi
C=corpus=/tmp/corpus/prose-llama2,rates_from=sweeps/lr_scan/results.json
COMMON="--compilation_cache=/tmp/jaxcache --min_run_s=90"
rc=0
if [[ " $PHASES " == *" t7 "* ]] && [ ! -f /tmp/t7.done ]; then
  python3 experiments/sweep.py --config=configs/sweeps/table7_small.py:$C --root=/tmp/sweeps/table7 $COMMON \
    --reuse_from=/tmp/sweeps/table2 --only=route=clvr --only=route=none ${EXTRA7:-} \
    --deadline_s=$((B-SECONDS)) --export=$OUT/table7; rc=$?
  echo "table7 rc=$rc at ${SECONDS}s"; [ $rc = 0 ] && touch /tmp/t7.done
fi
[ $rc = 0 ] || exit $rc
mkdir -p /tmp/tp
[[ " $PHASES " == *" tp "* ]] && for p in softmax_dense gdn_pure gdn_hybrid kda_hybrid deltanet_pure deltanet_hybrid kda_pure gdn2_pure gdn2_hybrid; do
  python3 -c "import json,sys; sys.exit(0 if '$p' in json.load(open('/tmp/tp/train_throughput.json'))['runs'] else 1)" 2>/dev/null && continue
  left=$((B-SECONDS-10)); [ $left -gt 75 ] || { echo "throughput: no time for $p"; rc=3; break; }
  timeout $left python3 benchmarks/train_throughput.py --out=/tmp/tp --size=small --batch_size=16 \
    --corpus=/tmp/corpus/prose-llama2 --presets=$p --steps=120 --opt=adamw > /tmp/tp/$p.log 2>&1
  echo "throughput $p rc=$? at ${SECONDS}s"; tail -3 /tmp/tp/$p.log
done
[[ " $PHASES " == *" tp "* ]] && mkdir -p $OUT/tp && cp /tmp/tp/train_throughput.* $OUT/tp/
[ $rc = 0 ] || exit $rc
if [[ " $PHASES " == *" ps "* ]] && [ $((B-SECONDS)) -gt 150 ]; then
  python3 experiments/sweep.py --config=configs/sweeps/params_small.py:$C --root=/tmp/sweeps/params \
    $COMMON --reuse_from=/tmp/sweeps/table2 ${EXTRAP:-} --deadline_s=$((B-SECONDS)) \
    --export=$OUT/params; rc=$?
  echo "params rc=$rc at ${SECONDS}s"
fi
[ $rc = 0 ] || exit $rc
if [[ " $PHASES " == *" t2 "* ]] && [ $((B-SECONDS)) -gt 150 ]; then
  python3 experiments/sweep.py --config=configs/sweeps/table2_small.py:$C${T2_ARG:-} --root=/tmp/sweeps/table2 $COMMON \
    $T2_ONLY ${EXTRA2:-} --deadline_s=$((B-SECONDS)) --export=$OUT/table2; rc=$?
  echo "table2 rc=$rc at ${SECONDS}s"
fi
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
exit $rc
