#!/usr/bin/env bash
# One lease of a GPU machine (torch, no Ray, no vLLM), every GPU figure the open issues ask for, each part under a
# time limit of its own so a slow part cannot cost the others, results streamed to $OUT (or ./gpu-out) as they come:
#   1. one long datum whole on one rank: the 8B shape at 32k and 64k tokens, the 0.6B shape at 64k and 128k
#   2. sequence parallelism, the 0.6B shape at 32k tokens: each rank's peak, split over 2 ranks against whole
#      (both ranks on the one GPU, their collectives over gloo: memory is the figure, not time)
#   3. every model family's trainer at one shape (bench/gpu_families.py), then the lineup's shapes cut to 4 layers
# Wheels under .whl (transformers as the lock pins it) are installed first when present.
# On an H200 the parts took about 2, 2.5, 3 and 4 minutes: more than one 10-minute device call, so run them as two:
#     PARTS="long sp" bash bench/gpu_session.sh; PARTS="families lineup" bash bench/gpu_session.sh
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-gpu-out}
PARTS=${PARTS:-long sp families lineup}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
nvidia-smi -L
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

part() {  # part NAME SECONDS COMMAND...: the command's output to $OUT/NAME.log and here, stopped after SECONDS
    local name=$1 limit=$2
    shift 2
    [[ " $PARTS " == *" ${name%%-*} "* ]] || return 0
    echo "== $name (at most ${limit} s), $(date +%T)"
    timeout "$limit" "$@" 2>&1 | grep -v -E "it/s\]|s/it\]" | tee "$OUT/$name.log"
    echo "== $name: exit ${PIPESTATUS[0]}, $(date +%T)"
}

part long 190 python3 bench/gpu_scale.py --parts long --steps 1 --warmup 1 --out "$OUT/long"
part sp-build 60 python3 -m app.models.embedded --preset qwen3-0.6b --out /tmp/models/qwen3-0.6b
part sp 150 python3 bench/sequence_parallel.py --model /tmp/models/qwen3-0.6b --tokens 32768 --settings 1,2 \
    --allocator glibc --device cuda
part families 200 python3 bench/gpu_families.py --steps 2
part lineup 240 python3 bench/gpu_families.py --lineup --max-layers 4 --steps 2
nvidia-smi --query-gpu=name,memory.total --format=csv
