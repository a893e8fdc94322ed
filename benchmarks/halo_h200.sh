#!/usr/bin/env bash
# Drives the issue-27 HALO run (configs/halo_smollm2.py:h200) on a GPU machine that is reached
# only through calls of at most 10 minutes, each carrying at most 64 MiB, with nothing to
# download there. Run from the repository root on the GPU machine.
#
# Here (the development machine), once:
#   benchmarks/halo_h200.sh pack <corpus dir> <gguf> <wheels dir> <eval data dir> <out dir> \
#       [<teacher text dir>]
# writes <out dir>/bundle.tar.part<k> (pieces of 52 MiB: one per call) and bundle.tar.sha256.
# The bundle holds the corpus as experiments/corpus_pieces.py pieces (sha256-checked on join),
# the GGUF teacher, the wheels the GPU image lacks and the evaluation data
# (experiments/halo_eval_subset.py), and, if given, a token-shard directory of text the teacher
# wrote (experiments/generate_corpus.py), which `start` passes as the config's teacher_text.
#
# There, one call per piece (the piece carried in an ignored folder of the checkout):
#   benchmarks/halo_h200.sh receive <carried piece files...>   # kept outside the checkout
# then, in the call that carries the last piece:
#   benchmarks/halo_h200.sh start      # checks, unpacks, starts the pipeline in its own session
# and in each later call:
#   benchmarks/halo_h200.sh wait <seconds>   # waits, then copies the run's small files to $OUT
#
# Paths there: XFER (default /tmp/xfer), WORK (default /tmp/halo_h200), SITE (default
# /tmp/site). The pipeline is experiments/halo_pipeline.py; its log is $WORK.log and its
# per-invocation record $WORK/pipeline.jsonl. Extra pipeline flags: HALO_FLAGS.
set -euo pipefail
cmd=${1:?usage: halo_h200.sh pack|receive|start|wait|collect ...}
shift
XFER=${XFER:-/tmp/xfer}
WORK=${WORK:-/tmp/halo_h200}
SITE=${SITE:-/tmp/site}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

collect() {  # the run's small files (no checkpoints, no compilation cache) into $OUT
  [[ -n "${OUT:-}" && -d "$WORK" ]] || return 0
  (cd "$(dirname "$WORK")" && find "$(basename "$WORK")" -path '*/jax_cache' -prune -o \
      -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.md' -o -name '*.png' \) \
      -size -4M -print | tar czf "$OUT/halo_outputs.tgz" -T -)
  [[ -f "$WORK.log" ]] && tail -c 2000000 "$WORK.log" > "$OUT/halo.log"
  return 0
}

case "$cmd" in
  pack)
    corpus=${1:?corpus dir}; gguf=${2:?gguf}; wheels=${3:?wheels dir}; evaldata=${4:?eval dir}
    out=${5:?out dir}
    teacher_text=${6:-}
    stage=$(mktemp -d)
    mkdir -p "$stage/bundle" "$out"
    python3 experiments/corpus_pieces.py --mode=split --directory="$corpus" \
        --pieces_dir="$stage/bundle/pieces" --piece_mib=4096
    if [[ -n "$teacher_text" ]]; then
      python3 experiments/corpus_pieces.py --mode=split --directory="$teacher_text" \
          --pieces_dir="$stage/bundle/teacher_pieces" --piece_mib=4096
    fi
    cp "$gguf" "$stage/bundle/$GGUF_NAME"
    cp -r "$wheels" "$stage/bundle/whl"
    cp -r "$evaldata" "$stage/bundle/halo_data"
    (cd "$stage" && tar cf bundle.tar bundle && sha256sum bundle.tar > bundle.tar.sha256)
    (cd "$stage" && split -b 52m -d -a 1 bundle.tar bundle.tar.part)
    mv "$stage"/bundle.tar.part* "$stage/bundle.tar.sha256" "$out/"
    rm -rf "$stage"
    ls -la "$out"
    ;;
  receive)
    mkdir -p "$XFER"
    cp "$@" "$XFER/"
    ls -la "$XFER"
    ;;
  start)
    cd "$XFER"
    cat bundle.tar.part* > bundle.tar
    sha256sum -c bundle.tar.sha256
    tar xf bundle.tar && rm bundle.tar bundle.tar.part*
    cd - > /dev/null
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$XFER"/bundle/whl/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    manifest=$(ls "$XFER"/bundle/pieces/*.pieces.json)
    python3 experiments/corpus_pieces.py --mode=join --manifest="$manifest" \
        --output_dir="$XFER/corpus"
    name=$(basename "$manifest" .pieces.json)
    config="configs/halo_smollm2.py:h200,corpus=$XFER/corpus/$name"
    if compgen -G "$XFER/bundle/teacher_pieces/*.pieces.json" > /dev/null; then
      manifest=$(ls "$XFER"/bundle/teacher_pieces/*.pieces.json)
      python3 experiments/corpus_pieces.py --mode=join --manifest="$manifest" \
          --output_dir="$XFER/corpus"
      config="$config,teacher_text=$XFER/corpus/$(basename "$manifest" .pieces.json)"
    fi
    mkdir -p "$WORK"
    # shellcheck disable=SC2086
    setsid nohup env PYTHONUNBUFFERED=1 python3 experiments/halo_pipeline.py \
        --config="$config" --workdir="$WORK" \
        --config.teacher.path="$XFER/bundle/$GGUF_NAME" \
        --config.report.data_dir="$XFER/bundle/halo_data" ${HALO_FLAGS:-} \
        > "$WORK.log" 2>&1 < /dev/null &
    echo "pipeline started: pid $!, log $WORK.log"
    sleep 60
    tail -n 20 "$WORK.log"
    collect
    ;;
  wait)
    seconds=${1:?seconds}
    end=$((SECONDS + seconds))
    while (( SECONDS < end )) && pgrep -f experiments/halo_pipeline.py > /dev/null; do
      sleep 10
    done
    pgrep -f experiments/halo_pipeline.py > /dev/null && echo "pipeline: running" \
        || echo "pipeline: not running"
    grep -E '^(===|pipeline:)|/ (student|teacher|student_stage2):|niah / .* @ ' "$WORK.log" \
        | tail -n 60 || true
    tail -n 8 "$WORK.log"
    collect
    ;;
  collect)
    collect
    ;;
  *)
    echo "unknown command $cmd" >&2
    exit 2
    ;;
esac
