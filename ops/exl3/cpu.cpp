// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the EXL3 op family: argument checks and the plain reference of
/// include/tessera/ref/exl3_ref.hpp (decode to W', bit-exact xh, float64-summed xh W', exact epilogue).
#include <string>
#include <vector>

#include "tessera/core/concepts.hpp"
#include "tessera/ops/exl3.hpp"
#include "tessera/ref/exl3_ref.hpp"

namespace tessera::ops {

static_assert(BackendOp<Exl3Gemm<Backend::kCpu>, Exl3GemmDesc, Exl3GemmArgs>);
static_assert(BackendOp<Exl3Dequant<Backend::kCpu>, Exl3LayerDesc, Exl3DequantArgs>);
static_assert(BackendOp<Exl3GroupedGemm<Backend::kCpu>, Exl3GroupedGemmDesc, Exl3GroupedGemmArgs>);

Status check_exl3_layer(Exl3LayerDesc const& d) {
  if (d.k <= 0 || d.k % exl3::kHadDim)
    return invalid_argument("exl3: in_features k = " + std::to_string(d.k) + " is not a positive multiple of 128");
  if (d.n <= 0 || d.n % exl3::kHadDim)
    return invalid_argument("exl3: out_features n = " + std::to_string(d.n) + " is not a positive multiple of 128");
  if (d.k2 < 2 || d.k2 > 16)
    return invalid_argument("exl3: bits = " + std::to_string(d.k2 / 2.0) + " outside 1..8");
  if (d.k2 % 2 && (d.codebook != exl3::Codebook::kMul1 || d.k2 > 7))
    return invalid_argument("exl3: half-integer rate " + std::to_string(d.k2 / 2.0) + " exists only for MUL1 1.5/2.5/3.5");
  return {};
}

Status check_exl3_chunk_n(Exl3GemmDesc const& d) {
  if (d.chunk_n != 0 && (d.chunk_n < d.layer.n || d.chunk_n % exl3::kHadDim != 0))
    return invalid_argument("exl3 gemm: chunk_n = " + std::to_string(d.chunk_n) + " must be 0 or a multiple of 128 "
                            "not below the layer's n = " + std::to_string(d.layer.n));
  return {};
}

namespace {

Status check_trellis(Exl3LayerDesc const& d, TensorView<int16_t const, 3> const& t) {
  if (!t.data || !t.is_contiguous() || t.shape[0] != d.k / 16 || t.shape[1] != d.n / 16 ||
      t.shape[2] != exl3::words16_per_tile(d.k2))
    return invalid_argument("exl3: trellis must be contiguous [k/16, n/16, 8*k2] = [" + std::to_string(d.k / 16) +
                            ", " + std::to_string(d.n / 16) + ", " + std::to_string(8 * d.k2) + "]");
  return {};
}

template <class T>
bool is_vec(TensorView<T, 1> const& v, int64_t n) { return v.data && v.shape[0] == n && v.stride[0] == 1; }
template <class T>
bool is_mat(TensorView<T, 2> const& v, int64_t r, int64_t c) {
  return v.data && v.shape[0] == r && v.shape[1] == c && v.is_contiguous();
}

ref::Exl3HostLayer host_layer(Exl3LayerDesc const& d, int16_t const* trellis, Fp16 const* suh, Fp16 const* svh,
                              Fp16 const* bias) {
  ref::Exl3HostLayer L;
  L.k = d.k; L.n = d.n; L.k2 = d.k2; L.codebook = d.codebook;
  L.trellis = trellis;
  L.suh = reinterpret_cast<uint16_t const*>(suh);
  L.svh = reinterpret_cast<uint16_t const*>(svh);
  L.bias = reinterpret_cast<uint16_t const*>(bias);
  return L;
}

}  // namespace

Status Exl3Dequant<Backend::kCpu>::check(Exl3LayerDesc const& d) { return check_exl3_layer(d); }

Status Exl3Dequant<Backend::kCpu>::run(Exl3LayerDesc const& d, Exl3DequantArgs const& a, ExecContext&) {
  TESSERA_TRY(check(d));
  TESSERA_TRY(check_trellis(d, a.trellis));
  if (a.transposed ? !is_mat(a.w, d.n, d.k) : !is_mat(a.w, d.k, d.n))
    return invalid_argument("exl3 dequant: w must be contiguous [k, n] ([n, k] when transposed)");
  ref::Exl3HostLayer L = host_layer(d, a.trellis.data, nullptr, nullptr, nullptr);
  std::vector<uint16_t> table = ref::exl3_codebook_table(d.codebook);
  auto* w = reinterpret_cast<uint16_t*>(a.w.data);
  if (!a.transposed) {
    parallel_for(L.tiles_k(), [&](int64_t b, int64_t e) { ref::exl3_decode_rows(L, table.data(), b, e, w); });
    return {};
  }
  std::vector<uint16_t> wk(static_cast<size_t>(d.k * d.n));
  parallel_for(L.tiles_k(), [&](int64_t b, int64_t e) { ref::exl3_decode_rows(L, table.data(), b, e, wk.data()); });
  for (int64_t i = 0; i < d.k; ++i)
    for (int64_t j = 0; j < d.n; ++j) w[j * d.k + i] = wk[static_cast<size_t>(i * d.n + j)];
  return {};
}

Status Exl3Gemm<Backend::kCpu>::check(Exl3GemmDesc const& d) {
  TESSERA_TRY(check_exl3_layer(d.layer));
  if (d.out_type != DType::kF16 && d.out_type != DType::kF32)
    return not_supported("exl3 gemm: output dtype must be f16 or f32");
  if (d.num_rows < 0) return invalid_argument("exl3 gemm: negative row count");
  return check_exl3_chunk_n(d);
}

Status Exl3Gemm<Backend::kCpu>::run(Exl3GemmDesc const& d, Exl3GemmArgs const& a, ExecContext&) {
  TESSERA_TRY(check(d));
  Exl3LayerDesc const& l = d.layer;
  TESSERA_TRY(check_trellis(l, a.trellis));
  if (!is_mat(a.x, d.num_rows, l.k)) return invalid_argument("exl3 gemm: x must be contiguous [m, k]");
  if (!is_vec(a.suh, l.k) || !is_vec(a.svh, l.n)) return invalid_argument("exl3 gemm: suh [k] and svh [n] required");
  if (d.has_bias && !is_vec(a.bias, l.n)) return invalid_argument("exl3 gemm: bias must be [n]");
  if (d.num_rows == 0) return {};
  ref::Exl3HostLayer L = host_layer(l, a.trellis.data, a.suh.data, a.svh.data, d.has_bias ? a.bias.data : nullptr);
  auto const* x = reinterpret_cast<uint16_t const*>(a.x.data);
  if (d.out_type == DType::kF16) {
    if (!is_mat(a.y_f16, d.num_rows, l.n)) return invalid_argument("exl3 gemm: y_f16 must be contiguous [m, n]");
    ref::exl3_forward_f16(L, x, d.num_rows, reinterpret_cast<uint16_t*>(a.y_f16.data));
  } else {
    if (!is_mat(a.y_f32, d.num_rows, l.n)) return invalid_argument("exl3 gemm: y_f32 must be contiguous [m, n]");
    ref::exl3_forward_f32(L, x, d.num_rows, a.y_f32.data);
  }
  return {};
}

Status Exl3GroupedGemm<Backend::kCpu>::check(Exl3GroupedGemmDesc const& d) {
  TESSERA_TRY(check_exl3_layer(d.layer));
  if (d.num_experts <= 0 || d.num_tokens < 0 || d.num_assignments < 0)
    return invalid_argument("exl3 grouped gemm: bad expert/token/assignment counts");
  return {};
}

Status Exl3GroupedGemm<Backend::kCpu>::run(Exl3GroupedGemmDesc const& d, Exl3GroupedGemmArgs const& a, ExecContext&) {
  TESSERA_TRY(check(d));
  Exl3LayerDesc const& l = d.layer;
  if (!a.trellis || !a.suh || !a.svh || !a.expert_offsets || !a.token_idx)
    return invalid_argument("exl3 grouped gemm: pointer arrays missing");
  if (!is_mat(a.x, d.num_tokens, l.k) || !is_mat(a.y, d.num_assignments, l.n))
    return invalid_argument("exl3 grouped gemm: x [T, k] and y [A, n] must be contiguous");
  if (a.expert_offsets[0] != 0 || a.expert_offsets[d.num_experts] > d.num_assignments)
    return invalid_argument("exl3 grouped gemm: expert_offsets must run from 0 to at most A");
  auto const* x = reinterpret_cast<uint16_t const*>(a.x.data);
  for (int64_t e = 0; e < d.num_experts; ++e) {
    int64_t const a0 = a.expert_offsets[e], a1 = a.expert_offsets[e + 1];
    if (a1 < a0) return invalid_argument("exl3 grouped gemm: expert_offsets decrease at expert " + std::to_string(e));
    if (a1 == a0) continue;
    ref::Exl3HostLayer L = host_layer(l, a.trellis[e], a.suh[e], a.svh[e], nullptr);
    std::vector<uint16_t> xe(static_cast<size_t>((a1 - a0) * l.k));
    for (int64_t i = a0; i < a1; ++i) {
      int64_t t = a.token_idx[i];
      if (t < 0 || t >= d.num_tokens) return invalid_argument("exl3 grouped gemm: token_idx out of range");
      std::copy(x + t * l.k, x + (t + 1) * l.k, xe.begin() + (i - a0) * l.k);
    }
    float* y = a.y.data + a0 * l.n;
    ref::exl3_forward_f32(L, xe.data(), a1 - a0, y);
    if (a.route_weight)
      for (int64_t i = a0; i < a1; ++i)
        for (int64_t j = 0; j < l.n; ++j) y[(i - a0) * l.n + j] *= a.route_weight[i];
  }
  return {};
}

}  // namespace tessera::ops
