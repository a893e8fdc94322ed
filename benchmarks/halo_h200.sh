#!/usr/bin/env bash
# Drives the issue-27 HALO run (configs/halo_smollm2.py:h200) on a GPU machine that is reached
# only through calls of at most 10 minutes, each carrying at most 64 MiB, with nothing to
# download there, and whose disk does not outlive the session. Run from the repository root.
#
# Here (the development machine), once:
#   benchmarks/halo_h200.sh pack <corpus dir> <gguf> <wheels dir> <halo data dir> <out dir> \
#       [<teacher text dir>]
# writes two sha256-checked tars cut into equal pieces of at most 36 MiB (one per call; with
# the tree, 18.7 MiB on 2026-12-04, a call carries at most 64 MiB):
#   <out dir>/model.tar.part<k>: the GGUF teacher, the wheels the GPU image lacks, and the
#     evaluation sets of the teacher-text contamination check ($SHARED_DATA/eval and niah,
#     default ../shared/data) -- everything `generate` needs;
#   <out dir>/data.tar.part<k>: the corpus as experiments/corpus_pieces.py pieces, the report's
#     data (<halo data dir>, from experiments/halo_eval_subset.py) and, if given, a token-shard
#     directory of teacher text written earlier (experiments/generate_corpus.py).
#
# There, one call per piece (the piece carried in an ignored folder of the checkout):
#   benchmarks/halo_h200.sh receive <carried piece files...>   # kept in $XFER
#   benchmarks/halo_h200.sh generate   # after the last model piece: unpacks it and starts
#       # experiments/generate_corpus.py (the teacher writes expository text; GEN_DEADLINE_S,
#       # default 240 s, GEN_MAX_TOKENS, default 40M) in the background, while the data
#       # pieces arrive in the next calls
#   benchmarks/halo_h200.sh prepare    # instead of `generate`: unpacks the model tar and
#       # installs the wheels into $SITE only (to run GPU tests or benchmarks before `start`)
#   benchmarks/halo_h200.sh start      # after the last data piece: unpacks it and starts, in
#       # its own session, a driver that waits for the generation, then runs the pipeline
#   benchmarks/halo_h200.sh wait <seconds>   # waits and shows the log; once the run has
#       # ended (or with COLLECT=1), copies its small files to $OUT
# Without `generate`, `start` runs the pipeline at once (with the bundled teacher text if any).
# BRANCH_FLAGS (pipeline flags, e.g. another --config.stage3.optim.learning_rate): once the
# pipeline has finished, the driver copies its workdir without stage3, calibrate and report to
# $WORK-$BRANCH_NAME (default "branch") and runs stage3, calibrate and report there with
# HALO_FLAGS then BRANCH_FLAGS (the later value of a flag wins): two Stage-3 settings from one
# Stage 2 in one window. Both workdirs' small files come back. BRANCH_FROM (stage2, stage3,
# the default, calibrate or report; `start` refuses anything else) is the branch's first
# stage: the copy leaves out that stage and every later one, and the branch reruns them. So
# BRANCH_FROM=stage2 BRANCH_FLAGS="--config.hypenet.attention_layers=(3,7,11,15,19,23,27)" is
# the selection's ablation (evenly spaced attention layers) from the same Stage 1.
# HALO_FLAGS and BRANCH_FLAGS are split on spaces: no space inside a flag's value
# ("('perplexity','commonsense')", not "('perplexity', 'commonsense')").
#
# The machine is released after about 30 s without a call, and the run with it. Four runs were
# lost between two messages (12-02 stop 42; 12-03; 12-03b, whose wait brought back no files, so
# the gap is the turnaround between a reply and the next message, not the transfer). Calls sent
# in ONE message run back to back, about 5 s apart (12-03b's transfer calls). So send the whole
# run as one message: the transfer calls, `... start && halo_h200.sh wait 540`, then as many
# `halo_h200.sh wait 590` calls as cover the rest (a 25-minute run: two; add a third for
# margin). A `wait` returns as soon as the run ends, so a spare one costs seconds. A `wait` that
# finds the run going brings no files back, only the log's tail in its output (COLLECT=1 forces
# them); the wait that finds it ended copies them to $OUT.
#
# The generated text joins Stages 1 and 2 (config argument teacher_text) read TEACHER_WEIGHT
# times per pass. TEACHER_WEIGHT=auto (default) keeps the share of the 2026-12-02 plan, three
# readings of 40,116,931 tokens per pass (43% of what Stages 1 and 2 read): the weight is
# 3 x 40,116,931 / the generated tokens, rounded to 0.1, at least 1.
#
# Paths there: XFER (default /tmp/xfer), WORK (default /tmp/halo_h200), SITE (default
# /tmp/site). The pipeline is experiments/halo_pipeline.py; its log is $WORK.log and its
# per-invocation record $WORK/pipeline.jsonl; the generation's log is $WORK.gen.log, its
# manifest is copied to $WORK/teacher_text/manifest.json. Extra config arguments, appended to
# configs/halo_smollm2.py:h200,... (e.g. stage2_len=2048): CONFIG_ARGS. Extra pipeline flags:
# HALO_FLAGS; extra generation flags: GEN_FLAGS. SHOW_S: seconds `generate` and `start` wait
# before showing the log (45, 30). WAIT_POLL_S: seconds between `wait`'s checks of the run (2).
set -euo pipefail
cmd=${1:?usage: halo_h200.sh pack|receive|generate|prepare|start|wait|collect ...}
# Whitespace alone is no flag (BRANCH_FLAGS=' ' would rerun the main run's stages as a branch).
BRANCH_FLAGS=${BRANCH_FLAGS:-}
if [[ -z "${BRANCH_FLAGS//[[:space:]]/}" ]]; then BRANCH_FLAGS=""; fi
shift
XFER=${XFER:-/tmp/xfer}
WORK=${WORK:-/tmp/halo_h200}
SITE=${SITE:-/tmp/site}
SHARED_DATA=${SHARED_DATA:-../shared/data}
GEN_DIR="$XFER/gen/teacher-smollm2"
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
PIPELINE=${PIPELINE:-experiments/halo_pipeline.py}  # (a stand-in for tests of this script)
PLAN_TEACHER_TOKENS=40116931   # the 2026-12-02 teacher text (teacher-corpus-h200-2026-12-02.md)
PLAN_TEACHER_WEIGHT=3

branch_dir() {  # the second Stage 3's workdir (BRANCH_FLAGS); `collect` takes every $WORK-*
  echo "$WORK-${BRANCH_NAME:-branch}"
}

branch_stages() {  # the stages the branch reruns: BRANCH_FROM (default stage3) to report
  case ${BRANCH_FROM:-stage3} in
    stage2) echo stage2,stage3,calibrate,report ;;
    stage3) echo stage3,calibrate,report ;;
    calibrate) echo calibrate,report ;;
    report) echo report ;;
    *) echo "BRANCH_FROM=${BRANCH_FROM}: must be stage2, stage3, calibrate or report" >&2
       return 1 ;;
  esac
}

collect() {  # the run's small files (no checkpoints, no compilation cache) into $OUT
  [[ -n "${OUT:-}" ]] || return 0
  local dirs=() d
  for d in "$WORK" "$WORK"-*; do [[ -d "$d" ]] && dirs+=("$(basename "$d")"); done
  if (( ${#dirs[@]} )); then
    (cd "$(dirname "$WORK")" && find "${dirs[@]}" -path '*/jax_cache' -prune -o \
        -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.md' -o -name '*.png' \) \
        -size -4M -print | tar czf "$OUT/halo_outputs.tgz" -T -)
  fi
  [[ -f "$WORK.log" ]] && tail -c 2000000 "$WORK.log" > "$OUT/halo.log"
  [[ -f "$WORK.gen.log" ]] && tail -c 200000 "$WORK.gen.log" > "$OUT/gen.log"
  return 0
}

pack_tar() {  # <stage dir> <name>: <name>.tar of <stage dir>/bundle, cut into equal pieces
  local stage=$1 name=$2 bytes parts
  (cd "$stage" && tar cf "$name.tar" bundle && sha256sum "$name.tar" > "$name.tar.sha256")
  bytes=$(stat -c %s "$stage/$name.tar")
  parts=$(( (bytes + (36 << 20) - 1) / (36 << 20) ))
  (cd "$stage" && split -n "$parts" -d -a 1 "$name.tar" "$name.tar.part" && rm "$name.tar")
}

unpack_tar() {  # <name>: joins $XFER/<name>.tar.part*, checks its sha256 and unpacks it
  local name=$1
  (cd "$XFER" && cat "$name".tar.part* > "$name.tar" && sha256sum -c "$name.tar.sha256" \
      && tar xf "$name.tar" && rm "$name.tar" "$name".tar.part*)
}

unpack_model() {  # the model tar, unless `prepare` or `generate` already unpacked it
  if [[ -d "$XFER/bundle/whl" ]] && ! compgen -G "$XFER/model.tar.part*" > /dev/null; then
    echo "model tar: already unpacked in $XFER/bundle"
    return 0
  fi
  unpack_tar model
}

install_wheels() {  # once: a second install would replace modules under a running generation
  [[ -f "$SITE/.installed" ]] && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$XFER"/bundle/whl/*.whl
  touch "$SITE/.installed"
}

alive() {  # <pid file>: whether the process it names runs
  [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2> /dev/null
}

case "$cmd" in
  pack)
    corpus=${1:?corpus dir}; gguf=${2:?gguf}; wheels=${3:?wheels dir}; halodata=${4:?halo data dir}
    out=${5:?out dir}
    teacher_text=${6:-}
    for d in "$SHARED_DATA/eval" "$SHARED_DATA/niah"; do
      [[ -d "$d" ]] || { echo "error: SHARED_DATA: no directory $d" >&2; exit 2; }
    done
    model=$(mktemp -d); data=$(mktemp -d)
    mkdir -p "$model/bundle" "$data/bundle" "$out"
    cp "$gguf" "$model/bundle/$GGUF_NAME"
    cp -r "$wheels" "$model/bundle/whl"
    tar cf - -C "$SHARED_DATA" eval niah | xz -6 > "$model/bundle/decon.tar.xz"
    python3 experiments/corpus_pieces.py --mode=split --directory="$corpus" \
        --pieces_dir="$data/bundle/pieces" --piece_mib=4096
    if [[ -n "$teacher_text" ]]; then
      python3 experiments/corpus_pieces.py --mode=split --directory="$teacher_text" \
          --pieces_dir="$data/bundle/teacher_pieces" --piece_mib=4096
    fi
    cp -r "$halodata" "$data/bundle/halo_data"
    pack_tar "$model" model
    pack_tar "$data" data
    mv "$model"/model.tar.* "$data"/data.tar.* "$out/"
    rm -rf "$model" "$data"
    ls -la "$out"
    ;;
  receive)
    mkdir -p "$XFER"
    cp "$@" "$XFER/"
    ls -la "$XFER"
    ;;
  generate)
    unpack_model
    install_wheels
    mkdir -p "$XFER/decon" "$WORK" "$(dirname "$GEN_DIR")"
    tar xJf "$XFER/bundle/decon.tar.xz" -C "$XFER/decon"
    # shellcheck disable=SC2086
    setsid nohup env PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
        python3 experiments/generate_corpus.py --model="$XFER/bundle/$GGUF_NAME" \
        --output_dir="$GEN_DIR" --batch_size=1024 --samples_per_prompt=4 --max_new_tokens=512 \
        --temperature=0.8 --max_tokens="${GEN_MAX_TOKENS:-40000000}" \
        --deadline_s="${GEN_DEADLINE_S:-240}" --eval_data="$XFER/decon/eval" \
        --eval_data="$XFER/decon/niah" --compilation_cache="$XFER/gen_jax_cache" \
        ${GEN_FLAGS:-} > "$WORK.gen.log" 2>&1 < /dev/null &
    echo $! > "$WORK.gen.pid"
    echo "generation started: pid $!, log $WORK.gen.log"
    sleep "${SHOW_S:-45}"
    tail -n 5 "$WORK.gen.log"
    ;;
  prepare)
    unpack_model
    install_wheels
    echo "wheels installed in $SITE: export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
    ;;
  start)
    if [[ -n "${BRANCH_FLAGS:-}" ]]; then branch_stages > /dev/null  # a bad BRANCH_FROM
    elif [[ -n "${BRANCH_FROM:-}${BRANCH_NAME:-}" ]]; then
      echo "BRANCH_FROM/BRANCH_NAME given without BRANCH_FLAGS: no branch would run" >&2
      exit 1
    fi
    if compgen -G "$XFER/data.tar.part*" > /dev/null; then
      unpack_tar data
    fi
    if [[ ! -d "$XFER/bundle/whl" ]]; then  # `generate` did not run: the model tar too
      unpack_tar model
    fi
    install_wheels
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    manifest=$(ls "$XFER"/bundle/pieces/*.pieces.json)
    python3 experiments/corpus_pieces.py --mode=join --manifest="$manifest" \
        --output_dir="$XFER/corpus"
    if compgen -G "$XFER/bundle/teacher_pieces/*.pieces.json" > /dev/null; then
      manifest=$(ls "$XFER"/bundle/teacher_pieces/*.pieces.json)
      python3 experiments/corpus_pieces.py --mode=join --manifest="$manifest" \
          --output_dir="$XFER/corpus"
    fi
    mkdir -p "$WORK"
    : > "$WORK.log"  # before the driver: its own redirection may come after the tail below
    setsid nohup "$0" _run >> "$WORK.log" 2>&1 < /dev/null &
    echo $! > "$WORK.driver.pid"
    echo "driver started: pid $!, log $WORK.log"
    sleep "${SHOW_S:-30}"
    tail -n 20 "$WORK.log"
    ;;
  _run)  # the driver (started by `start`): waits for the generation, then runs the pipeline
    name=$(basename "$(ls "$XFER"/bundle/pieces/*.pieces.json)" .pieces.json)
    config="configs/halo_smollm2.py:h200,corpus=$XFER/corpus/$name"
    text=""
    if [[ -f "$WORK.gen.pid" ]]; then
      echo "driver: waiting for the generation (pid $(cat "$WORK.gen.pid"))"
      while alive "$WORK.gen.pid"; do sleep 5; done
      tail -n 3 "$WORK.gen.log"
      [[ -f "$GEN_DIR/manifest.json" ]] && text=$GEN_DIR
    elif compgen -G "$XFER/bundle/teacher_pieces/*.pieces.json" > /dev/null; then
      text="$XFER/corpus/$(basename "$(ls "$XFER"/bundle/teacher_pieces/*.pieces.json)" \
          .pieces.json)"
    fi
    if [[ -n "$text" ]]; then
      mkdir -p "$WORK/teacher_text" && cp "$text/manifest.json" "$WORK/teacher_text/"
      weight=${TEACHER_WEIGHT:-auto}
      if [[ "$weight" == auto ]]; then
        weight=$(python3 -c "import json, sys; n = json.load(open(sys.argv[1]))['generation']\
['counts']['kept_tokens']; print(max(1.0, round($PLAN_TEACHER_WEIGHT * $PLAN_TEACHER_TOKENS \
/ n, 1)))" "$text/manifest.json")
      fi
      echo "driver: teacher text $text, read $weight times per pass in Stages 1 and 2"
      config="$config,teacher_text=$text,teacher_weight=$weight"
    fi
    config="$config${CONFIG_ARGS:+,$CONFIG_ARGS}"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    common=(--config="$config" --config.teacher.path="$XFER/bundle/$GGUF_NAME"
            --config.report.data_dir="$XFER/bundle/halo_data")
    if [[ -z "${BRANCH_FLAGS:-}" ]]; then
      # shellcheck disable=SC2086
      exec python3 "$PIPELINE" "${common[@]}" --workdir="$WORK" ${HALO_FLAGS:-}
    fi
    # shellcheck disable=SC2086
    python3 "$PIPELINE" "${common[@]}" --workdir="$WORK" ${HALO_FLAGS:-}
    branch=$(branch_dir)
    stages=$(branch_stages)
    echo "=== branch: $branch, from $WORK's stages before ${stages%%,*}, with: $BRANCH_FLAGS"
    rm -rf "$branch" && mkdir -p "$branch"
    for path in "$WORK"/*; do  # copies, not links: the pipeline rewrites its top-level files
      [[ ",$stages," == *",$(basename "$path"),"* ]] || cp -a "$path" "$branch/"
    done
    # shellcheck disable=SC2086
    exec python3 "$PIPELINE" "${common[@]}" --workdir="$branch" \
        --stages="$stages" ${HALO_FLAGS:-} $BRANCH_FLAGS
    ;;
  wait)
    seconds=${1:?seconds}
    end=$((SECONDS + seconds))
    while (( SECONDS < end )) && { alive "$WORK.driver.pid" || alive "$WORK.gen.pid"; }; do
      sleep "${WAIT_POLL_S:-2}"
    done
    if alive "$WORK.gen.pid"; then echo "generation: running"; tail -n 3 "$WORK.gen.log"; fi
    alive "$WORK.driver.pid" && echo "pipeline: running" || echo "pipeline: not running"
    pattern='^(===|pipeline:|driver:)|/ (student|teacher|student_stage2):|niah / .* @ '
    [[ -f "$WORK.log" ]] && { grep -E "$pattern" "$WORK.log" | tail -n 60 || true
                              tail -n 8 "$WORK.log"; }
    # Files brought back lengthen the gap before the next call (2026-12-03: the machine was
    # released right after a wait that returned 4.8 MB): while the run goes on, the log lines
    # above are the record, and the files come back with the wait that finds it ended.
    if alive "$WORK.driver.pid" && [[ "${COLLECT:-0}" != 1 ]]; then
      echo "files left on the machine until the run ends (COLLECT=1 brings them now)"
    else
      collect
    fi
    ;;
  collect)
    collect
    ;;
  *)
    echo "unknown command $cmd" >&2
    exit 2
    ;;
esac
