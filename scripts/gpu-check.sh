#!/usr/bin/env bash
# The GPU store's check on a GPU machine (one NVIDIA GPU, CUDA 13 driver; no Rust toolchain
# or network needed): the parity suite on the real kernels, then the benchmark table (1 M
# and 5 M entries, batches 1, 64 and 4096, GPU store next to the CPU store in the same run).
#
# Build the binary on a machine with Rust (x86-64 Linux), then carry it over with this tree:
#   cargo build --release --locked -p cohort-gpu-store --features cuda --bin gpu-check
#   scripts/gpu-check.sh                      # uses target/release/gpu-check
#   GPU_CHECK_BIN=/path/gpu-check scripts/gpu-check.sh --sizes 1000000 --seconds 2
# Flags after the script name go to gpu-check (--sizes, --batches, --seconds, --no-cpu,
# --parity-only, --no-parity, --no-ivf).
#
# Then, when the batcher binary built with the GPU store is there (COHORT_BIN, default
# target/release/cohort, from `cargo build --release --locked -p cohort-cli --features
# cuda`), the decision-path benchmark with --store gpu and, for comparison, --store cpu on
# the same machine (docs/GPU-STORE.md, "The decision path"). With GPU_CHECK_PROFILE=1, Nsight
# Compute's summary of one exact top-k scan (5 M entries, batch 4096), where ncu is installed
# and allowed to read the counters. Everything is bounded: the whole run stops after 440 s of gpu-check (under 8 minutes with the 30 s
# torch reference).
# Exit status: gpu-check's (0 pass, 1 a parity case or device error, 2 no usable GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${GPU_CHECK_BIN:-target/release/gpu-check}
if [ ! -x "$bin" ]; then
  echo "gpu-check.sh: $bin not found. Build it where Rust is installed:"
  echo "  cargo build --release --locked -p cohort-gpu-store --features cuda --bin gpu-check"
  exit 2
fi
echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true

# cudarc opens libcuda.so.1 and libnvrtc.so.13 at run time: make the toolkit's NVRTC
# findable, or the one shipped in PyTorch's nvidia-cuda-nvrtc wheel.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
  wheel=$(python3 -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib"))' 2>/dev/null || true)
  [ -n "$wheel" ] && [ -d "$wheel" ] && export LD_LIBRARY_PATH="$wheel${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# The int8 peak the fractions are taken against is the H200's nominal dense figure; for
# reference, what PyTorch's int8 GEMM reaches on this device (30 s at most, optional).
echo "== int8 GEMM reference (torch._int_mm, 8192^3)"
timeout 30 python3 - <<'PY' || echo "torch reference skipped"
import time, torch
a = torch.randint(-128, 127, (8192, 8192), dtype=torch.int8, device="cuda")
b = torch.randint(-128, 127, (8192, 8192), dtype=torch.int8, device="cuda")
for _ in range(3): torch._int_mm(a, b)
torch.cuda.synchronize(); t = time.perf_counter(); n = 20
for _ in range(n): torch._int_mm(a, b)
torch.cuda.synchronize(); dt = time.perf_counter() - t
print(f"torch._int_mm: {2 * 8192**3 * n / dt / 1e12:.0f} TOPS")
PY

echo "== gpu-check $*"
status=0
timeout 440 "$bin" "$@" || status=$?

cohort=${COHORT_BIN:-target/release/cohort}
if [ -x "$cohort" ]; then
  for store in gpu cpu; do
    echo "== decision path, --store $store: recent neighbours, one load thread at 2,000 Assign/s"
    timeout 120 "$cohort" bench-decisions --store "$store" --entries 10000,1000000,5000000 --seconds 3 || status=$?
    echo "== decision path, --store $store: exact neighbours (a full scan per Assign), 16 load threads"
    timeout 120 "$cohort" bench-decisions --store "$store" --neighbours exact --threads 16 --entries 1000000,5000000 --rate 2000 --seconds 3 || status=$?
  done
else
  echo "== decision path skipped: $cohort not found"
fi

if [ "${GPU_CHECK_PROFILE:-0}" = 1 ]; then
  ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1 || true)
  if [ -n "$ncu" ]; then
    echo "== Nsight Compute: the third topk_scan launch (5 M entries, batch 4096)"
    timeout 120 "$ncu" --kernel-name topk_scan --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      "$bin" --no-parity --no-ivf --no-cpu --sizes 5000000 --batches 4096 --seconds 0.5 || echo "ncu failed"
  else
    echo "== no ncu on this machine"
  fi
fi
exit $status
