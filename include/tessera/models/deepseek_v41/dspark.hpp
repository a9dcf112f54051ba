// SPDX-License-Identifier: Apache-2.0
/// DSpark, DeepSeek-V4.1's in-checkpoint drafter (spec/deepseek-v41.md §2.8, unverified against any
/// inference reference: implemented as the spec states it, checked for internal consistency only).
///
/// Target features: for each layer t in `dspark_target_layer_ids` the mean over the n hc streams of the
/// residual streams entering t's attention site (after t's Engram write), recorded per committed position
/// during the target forward: F[p] = [f_{t0}(p) ; f_{t1}(p) ; …] ∈ R^{|T|·D}. Context c[p] =
/// main_norm(main_proj(F[p])) ∈ R^D for p ∈ (a − W, a], a = the last fed position.
///
/// A pass for the anchor token x (the pending token at position a + 1, not fed yet) runs a block of B =
/// dspark_block_size rows at positions a+1 … a+B: row 0 is embed(x), rows 1 … B−1 embed(noise); n equal
/// streams, one-hot initial pre. Each draft block is a target layer without compressor, indexer or Engram:
/// mHC attention site, attn_norm, window attention with the `main` RoPE whose keys and values are
/// kv_norm(wkv(·)) + RoPE over [c[p] for p ∈ (a−W, a] ; the block's own rows], every query seeing every
/// context key and every row of its block (bidirectional), with the block's sink; mHC FFN site, ffn_norm,
/// the 128-expert top-3 MoE with its shared expert. h = collapse(X, last pre); base_i = lm_head(norm(h_i))
/// (the target's LM head), all rows in one pass. Drafts chain through the rank-r Markov head:
///   m_i = markov_embed[prev_i],  d_i = argmax(base_i + markov_head · m_i),  prev_0 = x, prev_i = d_{i−1};
/// confidence_i = σ(proj · [h_i ; m_i]) in fp32 (the acceptance logit through a sigmoid). Draft d_i is the
/// guess for the token at position a + 2 + i: d_0 is verified by x's own row.
///
/// Choices the spec leaves open (documented in docs/drafting.md): the context K/V are not FP8
/// fake-quantised (the spec names no quantiser for them); the tap is taken after the layer's Engram write;
/// drafting is always greedy (drafts need not match the sampler: verification keeps the output serial).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/core/status.hpp"
#include "tessera/models/common/drafter.hpp"
#include "tessera/models/deepseek_v41/model.hpp"

namespace tessera::model::dsv41 {

struct DsparkWeights {
  std::vector<LayerWeights> blocks;  // mHC, norms, attention (window only), router, experts, shared expert
  Tensor main_proj, main_norm;       // block 0: [D, |T|·D], [D]
  Tensor norm;                       // last block: [D]
  Tensor markov_embed, markov_head;  // last block: [V, r] each
  Tensor confidence;                 // last block: [1, D + r], fp32
};

/// The checkpoint's `mtp.{b}.*` tensors (native names; `model.mtp.{b}.*` also accepted) when present:
/// null when spec.dspark.blocks == 0 or the checkpoint has no `mtp.0.main_proj.weight`. With the
/// tensors present every one is required and shape-checked; errors name the tensor.
Result<std::shared_ptr<DsparkWeights const>> load_dspark_weights(ModelSpec const& spec, WeightSource const& src,
                                                                 Numerics numerics);

/// One DSpark pass (B = dspark_block_size rows).
struct DsparkPass {
  int64_t anchor_position = 0;     // a + 1 = the state's length
  std::vector<int32_t> tokens;     // [B] d_i
  std::vector<float> confidence;   // [B] σ(acceptance logit)
  std::vector<float> acceptance_logit;  // [B]
  std::vector<float> base_logits;  // [B, V] lm_head(norm(h))
  std::vector<float> hidden;       // [B, D] h
  std::vector<float> markov;       // [B, r] markov_embed[prev_i]
};

/// A drafter over one sequence's state (per-sequence: the server makes one per slot). Proposes nothing
/// until the state holds every committed token but the last (the first round feeds the prompt).
std::unique_ptr<Drafter> make_dspark_drafter(Dsv41Model const& model, Dsv41State const& state);

}  // namespace tessera::model::dsv41
