// SPDX-License-Identifier: Apache-2.0
/// Internals shared by the model's translation units: the per-forward chunk record (the reference's
/// per-forward `shared` dict plus positions) and the row-parallel linear layer.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/core/context.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/models/deepseek_v41/model.hpp"

namespace tessera::model::dsv41 {

struct Dsv41Model::Chunk {
  int64_t rows = 0;
  std::vector<int64_t> pos;             // [S] absolute positions
  ExecContext ctx;
  DType md = DType::kF32;
  // The per-forward shared state of spec §2.5.3-§2.5.4 (rebuilt every forward).
  int64_t ckv_src = -1;                 // layer whose compressed KV cache is published
  int64_t idx_src = -1;                 // layer whose index keys are published
  bool has_topk = false;
  std::vector<std::vector<int32_t>> topk;  // per row: selected entries, ascending
  bool has_cand = false;
  std::vector<uint8_t> cand;            // [S, T] candidate mask of the candidate source
};

/// out[r, o] = →md(x[r]·W[o]) for r < rows, W [out, in]; each element is one fixed-order dot product, so
/// the split across threads (rows × column blocks) never changes a value.
void linear(ExecContext& ctx, float const* x, int64_t rows, Tensor const& w, float* out, DType md);

}  // namespace tessera::model::dsv41
