// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the linear family: ref::linear_row (or linear_row_fma_seq) over rows (bf16 and block-scaled
/// weights widened one row at a time, ops::scaled_weight); the dot order follows md (ref::gemm_dot / bmm_dot).
#include <bit>
#include <cstdlib>
#include <string>
#include <vector>

#include "ops/cpu_common.hpp"
#include "tessera/ops/linear.hpp"
#include "tessera/ops/linear_tc.hpp"
#include "tessera/ref/common_ref.hpp"

namespace tessera::ops {

namespace {
template <class T>
Status check_rows(TensorView<T, 2> const& v, int64_t rows, int64_t cols, char const* what) {
  if (v.shape[0] != rows || v.shape[1] != cols)
    return invalid_argument(std::string(what) + ": shape [" + std::to_string(v.shape[0]) + ", " +
                            std::to_string(v.shape[1]) + "], expected [" + std::to_string(rows) + ", " +
                            std::to_string(cols) + "]");
  if (rows > 0 && cols > 0 && (!v.data || v.stride[1] != 1 || v.stride[0] < cols))
    return invalid_argument(std::string(what) + " needs unit inner stride and non-overlapping rows");
  return {};
}
}  // namespace

Status check_linear(LinearDesc const& d, LinearArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(d.rows >= 0 && d.in > 0 && d.out > 0, "linear needs rows >= 0, in > 0, out > 0");
  TESSERA_CHECK(d.groups >= 1 && d.groups <= (int64_t{1} << 20), "linear needs 1 <= groups <= 2^20");
  TESSERA_TRY(check_rows(a.x, d.rows, d.groups * d.in, "linear x"));
  TESSERA_TRY(check_rows(a.y, d.rows, d.groups * d.out, "linear y"));
  int64_t const wrows = d.groups * d.out, kb = (d.in + 31) / 32;
  if (d.weight_dtype == DType::kF32) TESSERA_TRY(check_shape(a.w, {wrows, d.in}, "linear w"));
  else if (d.weight_dtype == DType::kBf16) TESSERA_TRY(check_shape(a.w_bf16, {wrows, d.in}, "linear w_bf16"));
  else if (d.weight_dtype == DType::kF8E4m3) {
    TESSERA_CHECK(d.groups == 1 || d.out % 32 == 0, "linear: grouped fp8 weights need out % 32 == 0 (whole scale blocks)");
    TESSERA_TRY(check_rows(a.w_q, wrows, d.in, "linear w_q (fp8)"));
    TESSERA_TRY(check_rows(a.w_scale, (wrows + 31) / 32, kb, "linear w_scale (fp8, 32x32 blocks)"));
  } else if (d.weight_dtype == DType::kF4E2m1x2) {
    TESSERA_CHECK(d.in % 2 == 0, "linear: fp4 weights need an even in (two codes per byte)");
    TESSERA_TRY(check_rows(a.w_q, wrows, d.in / 2, "linear w_q (fp4)"));
    TESSERA_TRY(check_rows(a.w_scale, wrows, kb, "linear w_scale (fp4, per row and 32 columns)"));
  } else {
    return invalid_argument("linear weight_dtype must be f32, bf16, f8_e4m3 or f4_e2m1x2");
  }
  TESSERA_CHECK(d.rows == 0 || static_cast<void const*>(a.x.data) != static_cast<void const*>(a.y.data),
                "linear y must not alias x");
  return {};
}

Status Linear<Backend::kCpu>::check(LinearDesc const& d, LinearArgs const& a) {
  TESSERA_TRY(check_linear(d, a));
  if (d.weight_dtype != DType::kF32 && d.md == DType::kBf16) {
    for (int64_t r = 0; r < d.rows; ++r)
      for (int64_t i = 0; i < d.groups * d.in; ++i) {
        float const v = a.x(r, i);
        if (v == v && std::bit_cast<uint32_t>(v) != std::bit_cast<uint32_t>(round_to_bf16(v)))
          return invalid_argument("linear x[" + std::to_string(r) + ", " + std::to_string(i) +
                                  "] is not a bf16 value (bf16 weights with a bf16 output take bf16 activations)");
      }
  }
  return {};
}

LinearArgs linear_group(LinearDesc const& d, LinearArgs const& a, int64_t g) {
  LinearArgs s;
  s.x = TensorView<float const, 2>(a.x.data + g * d.in, {d.rows, d.in}, {a.x.stride[0], 1}, a.x.device);
  if (a.w.data) s.w = TensorView<float const, 2>(a.w.data + g * d.out * a.w.stride[0], {d.out, d.in}, a.w.stride, a.w.device);
  if (a.w_bf16.data)
    s.w_bf16 = TensorView<Bf16 const, 2>(a.w_bf16.data + g * d.out * a.w_bf16.stride[0], {d.out, d.in}, a.w_bf16.stride,
                                         a.w_bf16.device);
  if (a.w_q.data) {
    int64_t const qrow = g * d.out;
    int64_t const srow = d.weight_dtype == DType::kF8E4m3 ? qrow / 32 : qrow;
    s.w_q = TensorView<uint8_t const, 2>(a.w_q.data + qrow * a.w_q.stride[0], {d.out, a.w_q.shape[1]}, a.w_q.stride, a.w_q.device);
    s.w_scale = TensorView<uint8_t const, 2>(a.w_scale.data + srow * a.w_scale.stride[0],
                                             {d.weight_dtype == DType::kF8E4m3 ? (d.out + 31) / 32 : d.out, a.w_scale.shape[1]},
                                             a.w_scale.stride, a.w_scale.device);
  }
  s.y = TensorView<float, 2>(a.y.data + g * d.out, {d.rows, d.out}, {a.y.stride[0], 1}, a.y.device);
  return s;
}

namespace {
Status run_cpu_group(LinearDesc const& d, LinearArgs const& a, ExecContext& ctx) {
  if (d.weight_dtype == DType::kF32) {
    detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        if (d.fma_chain) ref::linear_row_fma_seq(&a.x(r, 0), a.w.data, d.in, d.out, &a.y(r, 0), d.md);
        else ref::linear_row(&a.x(r, 0), a.w.data, d.in, d.out, &a.y(r, 0), d.md);
    }, 1);
    return {};
  }
  // bf16 or block-scaled weights: parallel over outputs, each output row widened once for all rows.
  bool const scaled = is_block_scaled(d.weight_dtype);
  detail::cpu_pool(ctx).parallel_for(d.out, [&](int64_t b, int64_t e) {
    std::vector<float> wrow(static_cast<size_t>(d.in));
    for (int64_t o = b; o < e; ++o) {
      for (int64_t i = 0; i < d.in; ++i)
        wrow[i] = scaled ? scaled_weight(d.weight_dtype, a.w_q.data, a.w_q.stride[0], a.w_scale.data, a.w_scale.stride[0], o, i)
                         : a.w_bf16(o, i).to_float();
      for (int64_t r = 0; r < d.rows; ++r)
        a.y(r, o) = ref::round_md(d.fma_chain ? ref::bmm_dot(&a.x(r, 0), wrow.data(), d.in, d.md)
                                              : ref::gemm_dot(&a.x(r, 0), wrow.data(), d.in, d.md), d.md);
    }
  }, 16);
  return {};
}
}  // namespace

Status Linear<Backend::kCpu>::run(LinearDesc const& d, LinearArgs const& a, ExecContext& ctx) {
  if (d.groups == 1) return run_cpu_group(d, a, ctx);
  LinearDesc one = d;
  one.groups = 1;
  for (int64_t g = 0; g < d.groups; ++g) TESSERA_TRY(run_cpu_group(one, linear_group(d, a, g), ctx));
  return {};
}

bool tc_quant_format_fused(DType w_format) { return w_format == DType::kF4E2m1x2 || w_format == DType::kF8E4m3; }

Status linear(ExecContext& ctx, LinearDesc const& d, LinearArgs const& a) {
  return detail::dispatch_cpu<Linear>(ctx, d, a);
}

}  // namespace tessera::ops
