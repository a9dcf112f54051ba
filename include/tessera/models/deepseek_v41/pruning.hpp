// SPDX-License-Identifier: Apache-2.0
/// Routed-expert pruning tools (spec/seed-notes.md §5; design/ARCHITECTURE.md §13.3: a lossy lever,
/// labelled and gated by measured retention). Calibration counts, per layer and expert, how often the
/// router selected the expert and with what summed routing weight; static pruning keeps the
/// `keep`·E experts of each layer with the largest summed weight (ties → lower id) and writes a
/// checkpoint without the others (gate rows and biases remapped, experts renumbered in ascending
/// original id, so the pruned model equals the original under the matching static mask, bit for bit).
/// Retention compares a candidate with its base teacher-forced: top-1 agreement, KL(base ‖ cand) per
/// position (natural log, fp64 over fp32 logits) and per-layer routing overlap |ids_b ∩ ids_c| / k.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/models/deepseek_v41/model.hpp"

namespace tessera::model::dsv41 {

/// Prompts file: one JSON value per line, either a list of token ids ([1, 2, 3]) or an object with
/// "ids": [...] or "text": "..." (text needs a tokenizer; `tokenize` may be empty, then text is an error).
/// Blank lines and lines starting with '#' are skipped.
Result<std::vector<std::vector<int32_t>>> read_prompts(
    std::string const& path, std::function<Result<std::vector<int32_t>>(std::string const&)> const& tokenize = {});

struct RoutingStats {
  int64_t layers = 0, experts = 0, top_k = 0, tokens = 0;
  std::vector<int64_t> count;   // [layers · experts] selections
  std::vector<double> weight;   // [layers · experts] summed routing weight
  std::string to_json() const;
  static Result<RoutingStats> from_json(std::string const& text);
};

/// Runs every prompt (one chunk each) and accumulates the router's selections.
Result<RoutingStats> calibrate(Dsv41Model& m, std::vector<std::vector<int32_t>> const& prompts);

/// Per-layer kept expert ids (ascending) keeping round(keep · E) ≥ top_k experts by summed weight.
Result<std::vector<std::vector<int32_t>>> choose_kept_experts(RoutingStats const& s, double keep);
/// The static mask equivalent to `kept` (nonzero = dropped).
std::vector<std::vector<uint8_t>> mask_from_kept(std::vector<std::vector<int32_t>> const& kept, int64_t experts);

/// Writes `out_dir`/{config.json, model.safetensors} (+ the Engram hash data and tokenizer.json copied
/// when present) with only the `kept` experts of each layer.
Status write_pruned_checkpoint(std::string const& src_dir, std::vector<std::vector<int32_t>> const& kept,
                               std::string const& out_dir);

struct RetentionReport {
  int64_t positions = 0, top1_agree = 0;
  std::vector<double> kl;             // per position, prompts concatenated
  std::vector<double> layer_overlap;  // per layer, mean over positions
  double agreement() const { return positions ? static_cast<double>(top1_agree) / positions : 0.0; }
  double kl_mean() const;
  double kl_quantile(double q) const;  // nearest rank
  double kl_max() const;
  std::string to_text() const;
  std::string to_json() const;
};

/// Teacher-forced retention of `cand` against `base` (same vocabulary and layer count). Prompts are fed
/// token by token when either model prunes at decode scope (so decode-only pruning applies), else in one
/// chunk. `cand_ids` maps the candidate's expert ids to the base's per layer (empty = identity).
Result<RetentionReport> measure_retention(Dsv41Model& base, Dsv41Model& cand,
                                          std::vector<std::vector<int32_t>> const& prompts,
                                          std::vector<std::vector<int32_t>> const& cand_ids = {});

/// An 8-bit grayscale PNG line plot of `v` (stored deflate blocks, CRC32, Adler32).
Status write_plot_png(std::string const& path, std::vector<double> const& v, int width = 640, int height = 240);

}  // namespace tessera::model::dsv41
