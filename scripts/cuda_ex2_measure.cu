// SPDX-License-Identifier: Apache-2.0
// Measures the hardware 2^r approximation behind CUDA's expf (PTX ex2.approx.ftz.f32, MUFU.EX2) and checks the
// structure ref::cuda_expf relies on. Built and run by scripts/gen_cuda_expf_table.py on a GPU machine.
//   raw grids: y+[i] = ex2(i·2^-23), y-[i] = ex2(-i·2^-23), i < 2^23, as little-endian uint32 bit patterns.
//   P1  r in [2^-126, 128):  ex2(r) = 2^n·y+[f·2^23], q = trunc(r·2^23)/2^23, n = ⌊q⌋, f = q − n
//   P2  r in (−1, −2^-126]:  ex2(r) = y-[trunc(|r|·2^23)]
//   P3  r in (−128, −1]:     ex2(r) = ftz(2^-n·y-[f·2^23]), q = trunc(|r|·2^23)/2^23, n = ⌊q⌋, f = q − n
// Each property prints its number of violating inputs; all must be 0.
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

__device__ __forceinline__ float ex2(float r) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(r));
  return y;
}
__device__ __forceinline__ float flush(float y) { return fabsf(y) < 1.17549435e-38f ? 0.f : y; }
__device__ unsigned long long g_violations[3];

__global__ void check(uint32_t first_bits, uint32_t count) {
  uint32_t const k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= count) return;
  float const a = __uint_as_float(first_bits + k);  // |r|, positive
  float const q = truncf(a * 8388608.f) * (1.f / 8388608.f);
  float const n = floorf(q), f = q - n;
  if (a < 128.f && ex2(a) != ldexpf(ex2(f), static_cast<int>(n))) atomicAdd(&g_violations[0], 1ull);
  if (a < 1.f && ex2(-a) != ex2(-q)) atomicAdd(&g_violations[1], 1ull);
  if (a >= 1.f && a < 128.f && ex2(-a) != flush(ldexpf(ex2(-f), -static_cast<int>(n)))) atomicAdd(&g_violations[2], 1ull);
}

__global__ void grid(uint32_t* pos, uint32_t* neg) {
  uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (1u << 23)) return;
  float const r = static_cast<float>(i) * (1.f / 8388608.f);
  pos[i] = __float_as_uint(ex2(r));
  neg[i] = __float_as_uint(ex2(-r));
}

int main(int argc, char** argv) {
  if (argc != 3) { std::fprintf(stderr, "usage: cuda_ex2_measure POS.u32 NEG.u32\n"); return 2; }
  unsigned long long zero[3] = {0, 0, 0};
  cudaMemcpyToSymbol(g_violations, zero, sizeof zero);
  uint32_t const lo = 0x00800000u, hi = 0x43000000u;  // [2^-126, 128)
  check<<<(hi - lo + 255) / 256, 256>>>(lo, hi - lo);
  uint32_t *pos, *neg;
  cudaMalloc(&pos, 4u << 23);
  cudaMalloc(&neg, 4u << 23);
  grid<<<(1u << 23) / 256, 256>>>(pos, neg);
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) { std::fprintf(stderr, "%s\n", cudaGetErrorString(e)); return 1; }
  unsigned long long v[3];
  cudaMemcpyFromSymbol(v, g_violations, sizeof v);
  std::printf("P1 violations %llu\nP2 violations %llu\nP3 violations %llu\n", v[0], v[1], v[2]);
  std::vector<uint32_t> h(1u << 23);
  for (int s = 0; s < 2; ++s) {
    cudaMemcpy(h.data(), s ? neg : pos, 4u << 23, cudaMemcpyDeviceToHost);
    FILE* f = std::fopen(argv[1 + s], "wb");
    if (!f || std::fwrite(h.data(), 4, h.size(), f) != h.size()) return 1;
    std::fclose(f);
  }
  return (v[0] | v[1] | v[2]) ? 3 : 0;
}
