// SPDX-License-Identifier: Apache-2.0
/// Shared fixtures of the rank-weight tests (rank_host_model, rank_loader, range_read, scaled_rank_model, the EXL3
/// rank models): the widened tiny configurations whose TP 2 / 4 slices of wq_b, wo_a and wo_b are whole FP8 32×32
/// blocks (wide_block_config) or fall on and off EXL3 128-column blocks (exl3_rank_config), a synthetic
/// checkpoint folder that lives for the test process, and plain TP/EP configurations.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "tessera/dist/plan.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"
#include "verify/model/fixture.hpp"

namespace tessera::verify {

/// The tiny preset with 8 heads in 4 o-groups of o_lora_rank 32 and hidden 128: every TP 2 / 4 slice of wq_b,
/// wo_a and wo_b is whole 32×32 blocks.
inline model::dsv41::Config wide_block_config() {
  model::dsv41::Config c = model::dsv41::tiny_config(512);
  c.num_attention_heads = 8;
  c.o_groups = 4;
  c.o_lora_rank = 32;
  c.hidden_size = 128;
  return c;
}

/// The tiny preset widened to 128-multiple dimensions for EXL3 (`make-synthetic --format exl3:B | mixed:B`): hidden
/// 128, head_dim 128, q / o_lora_rank 128, expert width 128, 4 heads in 2 o-groups, vocabulary 512, so every linear
/// is an EXL3 group; the TP 2 / 4 parts of wq_b, wo_a and the LM head are whole 128-column blocks, while wo_b's
/// rows (64 / 32 a rank) and the shared expert's (64 / 32) cut a block. The GPU model's EXL3 tests use it too.
inline model::dsv41::Config exl3_rank_config() {
  model::dsv41::Config c = model::dsv41::tiny_config(512);
  c.hidden_size = 128;
  c.head_dim = 128;
  c.q_lora_rank = 128;
  c.o_lora_rank = 128;
  c.moe_intermediate_size = 128;
  c.engram_head_dim = 64;
  return c;
}

/// A synthetic checkpoint written into a fresh temporary folder (removed at destruction). With link_golden the
/// folder also links the golden tiny fixture as `golden.safetensors`, the Engram hash data open_model_folder reads.
struct SyntheticFolder {
  std::filesystem::path dir;
  SyntheticFolder(std::string const& tag, model::dsv41::Config const& c, uint64_t seed,
                  model::dsv41::SyntheticFormat const& format, bool link_golden) {
    dir = std::filesystem::temp_directory_path() / ("tessera_" + tag + "_" + std::to_string(::getpid()));
    throw_if_error(model::dsv41::write_synthetic_checkpoint(c, dir.string(), seed, format).status());
    if (link_golden)
      std::filesystem::create_symlink(std::filesystem::absolute(tiny_dir("fp32") + "/golden.safetensors"),
                                      dir / "golden.safetensors");
  }
  SyntheticFolder(SyntheticFolder const&) = delete;
  SyntheticFolder& operator=(SyntheticFolder const&) = delete;
  ~SyntheticFolder() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string checkpoint() const { return (dir / "model.safetensors").string(); }
};

inline dist::ParallelConfig tp_ep(int tp, int ep) {
  dist::ParallelConfig c;
  c.tp = tp;
  c.ep = ep;
  return c;
}

inline std::string tp_ep_name(dist::ParallelConfig const& c) {
  return "tp" + std::to_string(c.tp) + " ep" + std::to_string(c.ep);
}

}  // namespace tessera::verify
