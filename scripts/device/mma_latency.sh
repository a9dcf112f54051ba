#!/bin/bash
# The dependent-issue latency of mma.sync.m16n8k16 (bf16 → fp32) on this GPU, in SM clock cycles per step: one
# warp runs 320 block steps (K = 5120) on one accumulator chain (the skinny tile's chain per 8 columns), with the
# fragments in registers, with one ldmatrix.x4 of A per step from shared memory, and as 2 and 4 interleaved
# independent chains (throughput per chain when the tensor pipe is shared). The floor of a skinny tile at
# decode: steps × cycles / clock.
# Usage (on the GPU machine): OUT=/some/dir bash scripts/device/mma_latency.sh
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
cat > $OUT/mma_latency.cu <<'CU'
#include <cstdio>
#include <cstdint>
__device__ __forceinline__ void mma(float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <int C, bool kLd>
__global__ void chain(int steps, float* out, long long* cyc) {
  __shared__ __align__(16) uint16_t xs[16 * 264];
  int const lane = threadIdx.x;
  for (int i = lane; i < 16 * 264; i += 32) xs[i] = 0x3f80;
  __syncwarp();
  uint32_t a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
  uint32_t const b0 = 0x3c003c00u + lane, b1 = 0x3c003c00u - lane;
  float d[C][4] = {};
  uint32_t const addr = static_cast<uint32_t>(__cvta_generic_to_shared(xs + (lane & 15) * 264 + (lane >> 4) * 8));
  long long const t0 = clock64();
  for (int s = 0; s < steps; ++s) {
    if (kLd) asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                          : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr + (s & 7) * 32) : "memory");
#pragma unroll
    for (int c = 0; c < C; ++c) mma(d[c], a, b0, b1);
  }
  long long const t1 = clock64();
  float v = 0.f;
  for (int c = 0; c < C; ++c) v += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  out[lane] = v;
  if (lane == 0) *cyc = t1 - t0;
}
template <int C, bool kLd>
void run(char const* what) {
  float* out; long long* cyc; cudaMalloc(&out, 128); cudaMalloc(&cyc, 8);
  int const steps = 320;
  chain<C, kLd><<<1, 32>>>(steps, out, cyc);  // warm-up
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  cudaEventRecord(e0);
  chain<C, kLd><<<1, 32>>>(steps, out, cyc);
  cudaEventRecord(e1); cudaEventSynchronize(e1);
  float ms = 0.f; cudaEventElapsedTime(&ms, e0, e1);
  long long c = 0; cudaMemcpy(&c, cyc, 8, cudaMemcpyDeviceToHost);
  int clk = 0; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  std::printf("%-44s %6.1f cycles per step, %lld cycles for %d steps (%.2f us at %.0f MHz); launch %.1f us\n", what,
              double(c) / steps, c, steps, double(c) / (clk / 1e3), clk / 1e3, ms * 1e3);
  cudaFree(out); cudaFree(cyc);
}
int main() {
  run<1, false>("1 chain, fragments in registers");
  run<1, true>("1 chain, ldmatrix.x4 of A per step");
  run<2, false>("2 interleaved chains (per step of each)");
  run<4, false>("4 interleaved chains (per step of each)");
  run<8, false>("8 interleaved chains (per step of each)");
  return 0;
}
CU
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o $OUT/mma_latency $OUT/mma_latency.cu && $OUT/mma_latency
