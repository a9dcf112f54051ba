// SPDX-License-Identifier: Apache-2.0
/// Multi-process serving's driver and followers (models/common/rank_driver.hpp) as thread ranks over the
/// in-process communicator, for tests: CPU rank models of a plan, follower threads running `follow`, rank 0's
/// RankDriver. Every rank model is wrapped in a FaultyModel, which can report a failure of its next call of an op
/// after running the call (so every collective still lines up, as the protocol requires).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tessera/core/thread_pool.hpp"
#include "tessera/models/common/rank_driver.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"

namespace tessera::verify {

class FaultyModel final : public model::LanguageModel {
 public:
  explicit FaultyModel(model::LanguageModel& inner) : inner_(inner) {}
  /// The next call of the op runs, then reports a failure (the flag clears).
  std::atomic<bool> fail_next_forward{false}, fail_next_clone{false}, fail_next_truncate{false};

  model::ModelInfo const& info() const override { return inner_.info(); }
  std::unique_ptr<model::SequenceState> new_sequence() override { return inner_.new_sequence(); }
  Status forward(std::span<model::SequenceStep> batch) override {
    Status s = inner_.forward(batch);
    return fail_next_forward.exchange(false) && s.ok() ? injected("forward") : s;
  }
  Result<std::unique_ptr<model::SequenceState>> clone(model::SequenceState const& state) override {
    auto c = inner_.clone(state);
    if (fail_next_clone.exchange(false) && c.ok()) return injected("clone");
    return c;
  }
  Status truncate(model::SequenceState& state, int64_t length) override {
    Status s = inner_.truncate(state, length);
    return fail_next_truncate.exchange(false) && s.ok() ? injected("truncate") : s;
  }
  size_t state_bytes_for(int64_t n) const override { return inner_.state_bytes_for(n); }

 private:
  static Status injected(char const* op) { return Status(StatusCode::kInternal, std::string("injected ") + op + " failure"); }
  model::LanguageModel& inner_;
};

/// W thread ranks of `full` under `cfg`: rank 0's driver in `driver`, ranks 1… following on their threads.
struct RankGroup {
  std::vector<std::unique_ptr<dist::InProcessCommunicator>> comms;
  std::vector<std::unique_ptr<ThreadPool>> pools;
  std::vector<std::unique_ptr<model::dsv41::Dsv41Model>> ranks;
  std::vector<std::unique_ptr<FaultyModel>> faulty;  // one per rank, over ranks[r]
  std::vector<Status> follower_status;
  std::vector<std::thread> threads;
  std::unique_ptr<model::RankDriver> driver;
  std::atomic<int> entered{0};  // calls of the driver's `enter` hook

  RankGroup(model::dsv41::Dsv41Model const& full, dist::ParallelConfig cfg) {
    auto plan = dist::make_plan(model::dsv41::model_dims(full.spec()), cfg).value_or_throw();
    int const W = plan.world;
    comms = dist::InProcessCommunicator::create(W);
    follower_status.resize(static_cast<size_t>(W));
    for (int r = 0; r < W; ++r) {
      pools.push_back(std::make_unique<ThreadPool>(1));
      auto sh = std::make_shared<model::dsv41::RankShard>(model::dsv41::RankShard{plan, r, comms[r].get()});
      ranks.push_back(model::dsv41::make_rank_model(full, sh, pools.back().get()).value_or_throw());
      faulty.push_back(std::make_unique<FaultyModel>(*ranks.back()));
    }
    for (int r = 1; r < W; ++r)
      threads.emplace_back([this, r] { follower_status[r] = model::follow(*faulty[r], *comms[r]); });
    driver = model::RankDriver::create(*faulty[0], *comms[0], {}, [this] {
               ++entered;
               return Status{};
             }).value_or_throw();
  }
  /// Shuts the group down; the first follower's failure, if any.
  Status stop() {
    Status s = driver ? driver->shutdown() : Status{};
    for (auto& t : threads)
      if (t.joinable()) t.join();
    for (size_t r = 1; r < follower_status.size(); ++r)
      if (s.ok() && !follower_status[r].ok()) s = follower_status[r];
    return s;
  }
  ~RankGroup() {
    driver.reset();  // sends the shutdown if stop() did not
    for (auto& t : threads)
      if (t.joinable()) t.join();
  }
};

}  // namespace tessera::verify
