#!/usr/bin/env bash
# The CUDA path on a machine with a GPU, in one go (about 10 minutes at most; each step limited):
#   1. tests/gpu (units, a trial hopping GPU <-> CPU, NCCL groups, a local run, scoring);
#   2. NCCL with two ranks on one GPU (a probe: NCCL is expected to refuse it);
#   3. benchmarks/unit_overhead.py on the GPU (small CNN, then the MLP);
#   4. benchmarks/peers_gpu.py (cerebro-spark's local backend against the plain job);
#   5. a profile of units of a small CNN on the GPU (where a unit's fixed cost goes).
# STEPS="peers_gpu profile" runs only those.
# Each step's output goes to $OUT (default: ./gpu-check) and each has its own time limit,
# so one that hangs does not take the others with it. Run from the repository root.
set -u
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}

{
  nvidia-smi -L; $PY -V
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0))'
  $PY -c 'import torch.distributed as d; print("nccl available:", d.is_nccl_available())'
  command -v java || echo "java: not found"; $PY -c 'import pyspark' 2>&1 | tail -1
  nproc; free -g | head -2
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [ -d .whl ]; then  # packages the machine lacks, carried as wheels (device README)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local began=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  echo "== $name: exit $? in $((SECONDS - began)) s" | tee -a "$OUT/steps.txt"
  tail -n 25 "$OUT/$name.txt"
}

cat >/tmp/nccl_probe.py <<'PY'
"""Two ranks of one group unit on the same GPU over NCCL (NCCL refuses: a GPU per rank)."""
import multiprocessing
import sys

sys.path.insert(0, "tests/gpu")
from test_cuda import _rank, free_port, task  # noqa: E402

from cerebro_spark.units import group_tasks  # noqa: E402

if __name__ == "__main__":
    ranks = group_tasks(task("mlp", epoch_units=2, checkpoint_out="p.pt"), [0, 1], "probe",
                        address="127.0.0.1", port=free_port(), timeout_s=20.0)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    processes = [context.Process(target=_rank, args=(r, "/tmp/nccl-probe", "cuda:0", out))
                 for r in ranks]
    for process in processes:
        process.start()
    for _ in processes:
        print("rank reply:", repr(out.get(timeout=35))[:800])
PY

# STEPS: which steps to run, in this order (default: all).
for name in ${STEPS:-pytest nccl_probe unit_overhead_cnn unit_overhead_mlp peers_gpu profile}; do
  case $name in
    pytest) step pytest 120 $PY -m pytest tests/gpu -v -p no:cacheprovider -rs --durations=10 ;;
    nccl_probe) step nccl_probe 40 $PY /tmp/nccl_probe.py ;;
    unit_overhead_cnn) step unit_overhead_cnn 120 $PY benchmarks/unit_overhead.py --device cuda \
        --model cnn --repeat 5 --targets 0.1,0.5,2 ;;
    unit_overhead_mlp) step unit_overhead_mlp 45 $PY benchmarks/unit_overhead.py --device cuda \
        --model mlp --repeat 5 --targets 0.1,0.5 ;;
    peers_gpu) step peers_gpu 210 $PY benchmarks/peers_gpu.py --repeats 3 --rows 60000 \
        --epochs 2 --out "$OUT/peers_gpu_table.txt" ;;
    profile) step profile 60 $PY benchmarks/unit_overhead.py --device cuda --model cnn \
        --profile ;;
    *) echo "unknown step $name" >&2; exit 2 ;;
  esac
done
cat "$OUT/steps.txt"
