// SPDX-License-Identifier: Apache-2.0
/// Multi-process tensor/expert-parallel serving (docs/multi-gpu.md, "Serving"): rank 0 drives, every other rank
/// follows. Each process holds one rank model (a Dsv41Model rank from make_rank_model or a GpuDsv41Model rank
/// from create_rank, sharded.hpp) whose forwards issue collectives that must line up on every rank. Rank 0
/// wraps its rank model in a RankDriver, the LanguageModel the engine and HTTP server use; the other ranks run
/// `follow`, which replays rank 0's calls on their rank models. Any LanguageModel works as the rank model.
///
/// Command channel: `cmd`, a communicator in HOST memory (InProcessCommunicator for thread ranks; over NCCL a
/// dist::HostStagingCommunicator wrapping the NcclCommunicator the rank model may also use directly). The
/// channel and the rank model's collectives interleave on one thread per rank in the same order on every rank,
/// so they may share one underlying communicator.
///
/// Protocol (every rank, in lockstep). A command is a broadcast from rank 0 of a kFrameBytes frame
///   [u32 magic][u32 op][u64 payload bytes][the first kFrameBytes − 16 payload bytes]
/// followed, only when the payload is longer, by a broadcast of the rest. The payload is little-endian
/// native words: first the sequence events since the previous command (u64 count, then one u64 each: a
/// sequence id, bit 63 set for "release", clear for "create"), applied in order; then the op's fields:
///   kForward:  u64 steps; per step u64 id, i64 tokens, i64 num_logit_rows; then every step's tokens (i32).
///   kClone:    u64 source id, u64 new id.
///   kTruncate: u64 id, i64 length.
///   kShutdown: nothing; followers return.
/// Rank 0 assigns ids (1, 2, …); followers keep id → state. new_sequence and a state's destruction only queue
/// events, so they cost no collective.
///
/// Agreement: after kForward, kClone and kTruncate every rank all-gathers a 256-byte report (i32 status
/// code, message), so all ranks know whether every rank succeeded. A failed forward is rolled back on every
/// rank: each state of the batch is truncated to its length before the step (ranks whose forward failed
/// already left it there), then a second report round says whether every rollback worked; where one did not
/// (or a truncate succeeded on some ranks only) the sequence's replicas differ and rank 0 refuses every
/// later call on it except its release. A failed clone is dropped everywhere. A follower that does not know
/// an id still runs the forward on fresh scratch states (so the collectives line up) and reports the error.
/// Bad input (foreign or diverged states, token ids outside the vocabulary, num_logit_rows out of range,
/// positions past max_context, a missing logits buffer) is refused on rank 0 before anything is broadcast.
///
/// Limits: a rank whose forward fails between two collectives leaves the other ranks blocked in the next one;
/// no protocol above the communicator can undo that (the in-process communicator's abort or NCCL's comm
/// abort end the whole group). Once a channel collective fails the group is broken: rank 0 refuses every
/// later call and followers return the error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "tessera/dist/communicator.hpp"
#include "tessera/models/common/language_model.hpp"

namespace tessera::model {

struct DriverChannel;  // the pending sequence events, shared with the driver's states

class RankDriver final : public LanguageModel {
 public:
  static constexpr size_t kFrameBytes = 1024;
  /// Rank 0's driver. `rank_model` is rank 0's rank model, `cmd` rank 0's command channel (host memory,
  /// rank 0). `keep_alive` is destroyed after the driver's shutdown (the rank model and communicators it
  /// owns, when the driver is handed to code that only keeps a LanguageModel). `enter`, when set, runs on
  /// the calling thread before every call reaches the rank model, and before a state's rank-model state is
  /// released: a GPU rank model's device made current (the engine calls from its own thread).
  static Result<std::unique_ptr<RankDriver>> create(LanguageModel& rank_model, dist::Communicator& cmd,
                                                    std::shared_ptr<void> keep_alive = {},
                                                    std::function<Status()> enter = {});
  /// Sends kShutdown unless shutdown() ran or the group is broken.
  ~RankDriver() override;

  ModelInfo const& info() const override { return info_; }
  std::unique_ptr<SequenceState> new_sequence() override;
  Status forward(std::span<SequenceStep> batch) override;
  Result<std::unique_ptr<SequenceState>> clone(SequenceState const& state) override;
  Status truncate(SequenceState& state, int64_t length) override;
  size_t state_bytes_for(int64_t num_tokens) const override { return model_.state_bytes_for(num_tokens); }

  /// Ends every follower's loop; later calls fail. Idempotent.
  Status shutdown();
  /// Commands broadcast so far (tests: a refused call broadcasts nothing).
  uint64_t commands_sent() const;
  /// Empty while the group works; the error that broke it otherwise.
  Status broken() const;

 private:
  RankDriver(LanguageModel& m, dist::Communicator& c, std::shared_ptr<void> keep, std::function<Status()> enter);
  /// Sends a command (the pending events, then `op_payload`); breaks the group on failure.
  Status send(uint32_t op, std::vector<uint8_t> const& op_payload);
  Status usable(SequenceState const& s, char const* what) const;
  Status enter() const;

  std::shared_ptr<void> keep_alive_;  // first member: released last
  LanguageModel& model_;
  dist::Communicator& cmd_;
  ModelInfo info_;
  std::shared_ptr<DriverChannel> channel_;
  mutable std::mutex mu_;  // one command at a time, in order
  uint64_t next_id_ = 1;
  uint64_t sent_ = 0;
  bool shut_ = false;
  Status broken_;
};

/// A follower rank's loop: receives rank 0's commands over `cmd` (host memory, rank ≥ 1) and runs them on
/// `rank_model` (logits to scratch memory) until kShutdown (returns success) or a channel failure (returns
/// it). A failure of the rank model's own call is reported to the group and the loop goes on. Runs on the
/// thread whose current device is the rank model's (GPU rank models).
Status follow(LanguageModel& rank_model, dist::Communicator& cmd);

/// Rank 0 without a driver (its start-up failed after the group formed): sends kShutdown so the followers'
/// loops end instead of waiting for a command.
Status shutdown_followers(dist::Communicator& cmd);

}  // namespace tessera::model
