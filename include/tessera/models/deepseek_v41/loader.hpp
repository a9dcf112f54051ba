// SPDX-License-Identifier: Apache-2.0
/// Loading a DeepSeek-V4.1 model folder: config.json through `load_config` (flat, composite or golden
/// form), the weights through `io::Checkpoint`, and the Engram hash state's stored data (multipliers and
/// compressed token map, see engram_tables.hpp) from, in order: the checkpoint itself
/// (`engram_hash.*`), `<dir>/engram_hash.safetensors`, or the golden fixture `<dir>/golden.safetensors`
/// (`static.engram.*`).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/io/safetensors.hpp"
#include "tessera/models/deepseek_v41/config.hpp"
#include "tessera/models/deepseek_v41/model.hpp"

namespace tessera::model::dsv41 {

/// A WeightSource over one or more checkpoints (the first holding a name wins). Native FP8 linears
/// (F8_E4M3 + 32×32-block F8_E8M0 `.scale`) and packed FP4 experts (I8 [r, c/2] + per-row-per-32 `.scale`)
/// load dequantised, with their logical shapes (spec/deepseek-v41.md §4.2). EXL3 groups (spec/exl3.md §1.1)
/// stand for the `P.weight` they replace (is_exl3 / load_exl3).
class CheckpointSource final : public WeightSource {
 public:
  void add(io::Checkpoint ckpt, std::string label);
  /// Opens `path` (file or folder) and adds it.
  Status open(std::string const& path);
  bool contains(std::string const& name) const override;
  Result<std::vector<int64_t>> shape(std::string const& name) const override;
  Result<DType> dtype(std::string const& name) const override;
  Result<Tensor> load_f32(std::string const& name) const override;
  Result<Tensor> load_i64(std::string const& name) const override;
  /// Native FP8 linears as kF8E4m3, packed FP4 experts as kF4E2m1x2 (their `.scale` shape checked).
  Result<ScaledWeight> load_scaled(std::string const& name) const override;
  /// From the checkpoint's header (the scaled weights below), nothing read.
  Result<DType> scaled_dtype(std::string const& name) const override;
  /// Only rows [r0, r1) of the tensor (block-scaled: their codes and the scale rows covering them) are read.
  Result<Tensor> load_f32_rows(std::string const& name, int64_t r0, int64_t r1) const override;
  /// Only the rows' codes and their scale rows are read (WeightSource::load_scaled_rows).
  Result<ScaledWeight> load_scaled_rows(std::string const& name, int64_t r0, int64_t r1) const override;
  /// Only the columns' codes / values and the scale columns covering them are read.
  Result<Tensor> load_f32_cols(std::string const& name, int64_t c0, int64_t c1) const override;
  /// Only the columns' codes and scale columns are read (WeightSource::load_scaled_cols).
  Result<ScaledWeight> load_scaled_cols(std::string const& name, int64_t c0, int64_t c1) const override;
  /// "P.weight" absent and "P.trellis" present: an EXL3 group, validated by ops::load_exl3_groups.
  bool is_exl3(std::string const& name) const override;
  Result<Exl3Weight> load_exl3(std::string const& name) const override;
  std::string describe() const override;

 private:
  enum class Scaled { kNone, kFp8Block, kFp4Row };
  Scaled scaled(std::string const& name) const;
  /// The stored codes and checked scales of a scaled tensor (kind != kNone) held by `c`.
  Result<ScaledWeight> load_stored(io::Checkpoint const& c, std::string const& name, Scaled kind) const;
  /// Rows [r0, r1) of a scaled tensor held by `c`: codes and the scale rows covering them (`whole_blocks`: the
  /// range must be whole FP8 scale blocks, check_scaled_row_range).
  Result<ScaledWeight> load_stored_rows(io::Checkpoint const& c, std::string const& name, Scaled kind, int64_t r0,
                                        int64_t r1, bool whole_blocks) const;
  /// Columns [c0, c1) of an FP8 scaled tensor held by `c`: codes and the scale columns covering them.
  Result<ScaledWeight> load_stored_cols(io::Checkpoint const& c, std::string const& name, int64_t c0, int64_t c1) const;
  io::Checkpoint const* find(std::string const& name) const;
  std::vector<io::Checkpoint> ckpts_;
  std::vector<std::string> labels_;
};

/// The model's view of a validated Config.
Result<ModelSpec> spec_from_config(Config const& c);

/// A model folder opened: its spec and its tensors (weights, then the Engram hash data if separate).
struct ModelFolder {
  ModelSpec spec;
  CheckpointSource src;
};
Result<ModelFolder> open_model_folder(std::string const& dir);

/// Loads `dir` (config.json + weights + Engram hash data) with the given numerics.
Result<std::unique_ptr<Dsv41Model>> load_model(std::string const& dir, ModelOptions opts);

}  // namespace tessera::model::dsv41
