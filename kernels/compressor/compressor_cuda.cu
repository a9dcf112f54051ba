// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the compressor family (include/tessera/ops/compressor.hpp, spec/deepseek-v41.md
/// §2.5.3): softmax-gated pooling of complete groups of r tokens, fp32, the arithmetic of
/// ref/compressor_ref.hpp per (group j, channel c):
///   m = max_i g_i[c];  s = Σ_i e_i, e_i = exp(g_i[c] − m)  (i ascending);
///   latent[c] = →md(Σ_i a_i[c]·(e_i/s))  (i ascending, dot_step),
/// exp in the model dtype's arithmetic (device::exp_md, as ref::exp_md).
/// One thread per (group, channel): a group's latent depends only on its r rows, never on the number of
/// groups in the call, so pooling the groups of a chunk together or in any split gives the same bits.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tessera/core/concepts.hpp"
#include "tessera/core/fmath.hpp"
#include "tessera/device/arith.cuh"
#include "tessera/device/op_launch.cuh"
#include "tessera/ops/compressor.hpp"

namespace tessera::kernels::compressor {

namespace {

constexpr int kThreads = 128;

struct PoolParams {
  float const* kv = nullptr;    // [groups·ratio, dim], row stride kv_stride
  float const* gate = nullptr;  // [groups·ratio, dim], row stride gate_stride
  float* out = nullptr;         // [groups, dim], row stride out_stride
  int64_t kv_stride = 0, gate_stride = 0, out_stride = 0;
  int64_t groups = 0, ratio = 0, dim = 0, col_blocks = 0;
  bool bf16 = false;
};

/// grid: groups · col_blocks blocks of kThreads; block b pools channels [cb·kThreads, …) of group b / col_blocks.
__global__ void __launch_bounds__(kThreads) compress_pool_kernel(PoolParams const p) {
  device::pdl_enter();
  int64_t const g = blockIdx.x / p.col_blocks;
  int64_t const c = (blockIdx.x % p.col_blocks) * kThreads + threadIdx.x;
  if (c >= p.dim) return;
  float const* a = p.kv + g * p.ratio * p.kv_stride + c;
  float const* gt = p.gate + g * p.ratio * p.gate_stride + c;
  float mx = -INFINITY;
  for (int64_t i = 0; i < p.ratio; ++i) mx = fmaxf(mx, gt[i * p.gate_stride]);
  float s = 0.f;
  for (int64_t i = 0; i < p.ratio; ++i) s = __fadd_rn(s, device::exp_md(__fsub_rn(gt[i * p.gate_stride], mx), p.bf16));
  float acc = 0.f;
  for (int64_t i = 0; i < p.ratio; ++i)
    acc = device::dot_step(acc, a[i * p.kv_stride],
                           __fdiv_rn(device::exp_md(__fsub_rn(gt[i * p.gate_stride], mx), p.bf16), s));
  p.out[g * p.out_stride + c] = p.bf16 ? round_to_bf16(acc) : acc;
}

}  // namespace

}  // namespace tessera::kernels::compressor

namespace tessera::ops {

static_assert(BackendOp<CompressPool<Backend::kCuda>, CompressPoolDesc, CompressPoolArgs>);

Status CompressPool<Backend::kCuda>::check(CompressPoolDesc const& d, CompressPoolArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(d.ratio >= 2, "compress_pool needs ratio >= 2 (ratio 1 has no pooling)");
  TESSERA_CHECK(d.groups >= 0 && d.dim >= 1, "compress_pool: bad sizes in desc");
  TESSERA_TRY(check_shape(a.kv, {d.groups * d.ratio, d.dim}, "compress_pool kv"));
  TESSERA_TRY(check_shape(a.gate, {d.groups * d.ratio, d.dim}, "compress_pool gate"));
  TESSERA_TRY(check_shape(a.out, {d.groups, d.dim}, "compress_pool out"));
  TESSERA_TRY(device::check_on_device(a.kv, "compress_pool kv"));
  TESSERA_TRY(device::check_on_device(a.gate, "compress_pool gate"));
  return device::check_on_device(a.out, "compress_pool out");
}

Status CompressPool<Backend::kCuda>::run(CompressPoolDesc const& d, CompressPoolArgs const& a, ExecContext& ctx) {
  namespace k = kernels::compressor;
  if (d.groups == 0) return {};
  k::PoolParams p;
  p.kv = a.kv.data;
  p.gate = a.gate.data;
  p.out = a.out.data;
  p.kv_stride = p.gate_stride = p.out_stride = d.dim;
  p.groups = d.groups;
  p.ratio = d.ratio;
  p.dim = d.dim;
  p.col_blocks = (d.dim + k::kThreads - 1) / k::kThreads;
  p.bf16 = d.md == DType::kBf16;
  int64_t const blocks = d.groups * p.col_blocks;
  TESSERA_CHECK(blocks < (int64_t{1} << 31), "compress_pool (CUDA): groups·dim exceeds the grid");
  device::launch_pdl(k::compress_pool_kernel, static_cast<unsigned>(blocks), k::kThreads, 0, ctx.stream, p);
  return device::launch_status("compress_pool (CUDA) kernel");
}

}  // namespace tessera::ops
