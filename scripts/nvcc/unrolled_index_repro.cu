// SPDX-License-Identifier: Apache-2.0
// A 16-byte shared-memory read whose address nvcc 13.0.88 (sm_90a) computes wrongly: in the unrolled loop, for
// t = t0 + lane (lane < 32), i = t / 128 = 0 for t0 = 0, j = (t % 128) / 16 and c = t % 16, so the byte offset
// (i·8 + j)·256 + c·16 is t·16 = lane·16; the PTX adds (lane·16 & 0x1F0) AND (lane·16 & 0xF0), i.e.
// lane·16 + c·16. The same expression without the loop, or indexed by row = t / 16 and c = t % 16, compiles
// right. kernels/linear/linear_tc_quant.cuh met this in its FP8 decode (16 units of 16 bytes per row) and
// indexes by (row, unit) for that reason. check_unrolled_index.sh compiles this file and says which it got.
#include <cstdint>

__global__ void unrolled_index(uint4* out, int stage_bytes, int s) {
  extern __shared__ __align__(16) unsigned char sm[];
  int const lane = threadIdx.x & 31;
#pragma unroll
  for (int t0 = 0; t0 < 128; t0 += 32) {
    int const t = t0 + lane;
    int const i = t / 128, rem = t % 128;
    int const j = rem / 16, c = rem % 16;
    out[t] = *reinterpret_cast<uint4 const*>(sm + s * stage_bytes + (i * 8 + j) * 256 + c * 16);
  }
}
