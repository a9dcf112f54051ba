// SPDX-License-Identifier: Apache-2.0
/// Rank 0's driver and the followers' loop (include/tessera/models/common/rank_driver.hpp: the protocol). The
/// per-rank halves of each op (forward with agreement and rollback, clone, truncate) are shared by both sides,
/// so every rank issues the same collectives in the same order by construction.
#include "tessera/models/common/rank_driver.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <string>
#include <unordered_map>

namespace tessera::model {

namespace {

enum Op : uint32_t { kForward = 1, kClone = 2, kTruncate = 3, kShutdown = 4 };
constexpr uint32_t kMagic = 0x31445254;  // "TRD1"
constexpr uint64_t kRelease = uint64_t{1} << 63;
constexpr size_t kHead = 16;  // u32 magic, u32 op, u64 payload bytes
constexpr size_t kInline = RankDriver::kFrameBytes - kHead;
constexpr uint64_t kMaxPayload = uint64_t{1} << 36;

struct Writer {
  std::vector<uint8_t> b;
  template <class T>
  void put(T v) {
    size_t const o = b.size();
    b.resize(o + sizeof v);
    std::memcpy(&b[o], &v, sizeof v);
  }
  void put_bytes(void const* p, size_t n) {
    size_t const o = b.size();
    b.resize(o + n);
    if (n) std::memcpy(&b[o], p, n);
  }
};

struct Reader {
  std::vector<uint8_t> const& b;
  size_t o = 0;
  bool ok = true;
  template <class T>
  T get() {
    T v{};
    if (!ok || b.size() - o < sizeof v) {
      ok = false;
      return v;
    }
    std::memcpy(&v, &b[o], sizeof v);
    o += sizeof v;
    return v;
  }
};

Status send_command(dist::Communicator& c, uint32_t op, std::vector<uint8_t>& payload) {
  std::array<uint8_t, RankDriver::kFrameBytes> f{};
  uint64_t const n = payload.size();
  std::memcpy(&f[0], &kMagic, 4);
  std::memcpy(&f[4], &op, 4);
  std::memcpy(&f[8], &n, 8);
  std::memcpy(&f[kHead], payload.data(), std::min<size_t>(n, kInline));
  TESSERA_TRY(c.broadcast(f.data(), f.size(), 0));
  if (n > kInline) TESSERA_TRY(c.broadcast(payload.data() + kInline, n - kInline, 0));
  return {};
}

struct Command {
  uint32_t op = 0;
  std::vector<uint8_t> payload;
};

Result<Command> receive_command(dist::Communicator& c) {
  std::array<uint8_t, RankDriver::kFrameBytes> f{};
  TESSERA_TRY(c.broadcast(f.data(), f.size(), 0));
  uint32_t magic = 0;
  uint64_t n = 0;
  Command cmd;
  std::memcpy(&magic, &f[0], 4);
  std::memcpy(&cmd.op, &f[4], 4);
  std::memcpy(&n, &f[8], 8);
  if (magic != kMagic || n > kMaxPayload)
    return Status(StatusCode::kInternal, "rank " + std::to_string(c.rank()) + ": the command frame from rank 0 is not one "
                                         "(magic " + std::to_string(magic) + ", " + std::to_string(n) + " payload bytes)");
  cmd.payload.resize(n);
  std::memcpy(cmd.payload.data(), &f[kHead], std::min<size_t>(n, kInline));
  if (n > kInline) TESSERA_TRY(c.broadcast(cmd.payload.data() + kInline, n - kInline, 0));
  return cmd;
}

/// One rank's outcome of an op, as all-gathered by every rank.
struct Report {
  int32_t code = 0;
  char msg[252] = {};
};
static_assert(sizeof(Report) == 256);

Result<std::vector<Report>> exchange(dist::Communicator& c, Status const& local) {
  Report me;
  me.code = static_cast<int32_t>(local.code());
  std::string const& m = local.message();
  std::memcpy(me.msg, m.data(), std::min(m.size(), sizeof me.msg - 1));
  std::vector<Report> all(static_cast<size_t>(c.size()));
  TESSERA_TRY(c.all_gather(&me, all.data(), sizeof(Report)));
  return all;
}

/// The lowest failing rank's status, its message prefixed with the rank; success if every rank succeeded.
Status first_failure(std::vector<Report> const& all) {
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].code != 0) {
      std::string m(all[r].msg, strnlen(all[r].msg, sizeof all[r].msg));
      return Status(static_cast<StatusCode>(all[r].code), "rank " + std::to_string(r) + ": " + m);
    }
  return {};
}

template <class F>
Status guarded(F&& f) {
  try {
    return f();
  } catch (std::exception const& e) {
    return Status(StatusCode::kInternal, e.what());
  }
}

struct Outcome {
  Status channel;     // a channel collective failed: the group is broken
  Status group;       // the op failed on some rank (the lowest one's status)
  bool diverged = false;
  Status divergence;  // why the replicas differ
};

/// Every rank: the forward (or, when `local_error` is set, the forward on whatever states the rank has, then
/// that error), one agreement round, and on failure the rollback of every state of the batch to its length
/// before the step plus a second round.
Outcome forward_everywhere(LanguageModel& m, dist::Communicator& c, std::span<SequenceStep> steps, Status local_error) {
  std::vector<std::pair<SequenceState*, int64_t>> before;
  for (auto const& s : steps)
    if (std::none_of(before.begin(), before.end(), [&](auto const& p) { return p.first == s.state; }))
      before.emplace_back(s.state, s.state->length());
  Status local = guarded([&] { return m.forward(steps); });
  if (!local_error.ok()) local = local_error;
  Outcome o;
  auto rep = exchange(c, local);
  if (!rep) return {rep.status()};
  o.group = first_failure(*rep);
  if (o.group.ok()) return o;
  Status rb;
  for (auto const& [s, len] : before)
    if (s->length() != len) {
      Status t = guarded([&] { return m.truncate(*s, len); });
      if (!t.ok() && rb.ok()) rb = t;
    }
  auto rep2 = exchange(c, rb);
  if (!rep2) return {rep2.status(), o.group};
  o.divergence = first_failure(*rep2);
  o.diverged = !o.divergence.ok();
  return o;
}

/// Every rank: the truncate and one round; diverged when it succeeded on some ranks only.
Outcome truncate_everywhere(LanguageModel& m, dist::Communicator& c, SequenceState* s, int64_t length, Status local_error) {
  Status local = local_error.ok() ? guarded([&] { return m.truncate(*s, length); }) : local_error;
  auto rep = exchange(c, local);
  if (!rep) return {rep.status()};
  Outcome o;
  o.group = first_failure(*rep);
  bool const any_ok = std::any_of(rep->begin(), rep->end(), [](Report const& r) { return r.code == 0; });
  if (!o.group.ok() && any_ok) {
    o.diverged = true;
    o.divergence = o.group;
  }
  return o;
}

/// Every rank: the clone and one round; the caller keeps its clone only when the group succeeded.
Result<std::unique_ptr<SequenceState>> clone_everywhere(LanguageModel& m, dist::Communicator& c, SequenceState const* s,
                                                        Status local_error, Status& channel) {
  Result<std::unique_ptr<SequenceState>> mine = local_error;
  if (local_error.ok()) {
    try {
      mine = m.clone(*s);
    } catch (std::exception const& e) {
      mine = Status(StatusCode::kInternal, e.what());
    }
  }
  auto rep = exchange(c, mine.status());
  if (!rep) {
    channel = rep.status();
    return channel;
  }
  TESSERA_TRY(first_failure(*rep));
  return mine;
}

}  // namespace

struct DriverChannel {
  std::mutex mu;
  std::vector<uint64_t> events;  // create: id; release: id | kRelease
  bool closed = false;
  std::function<Status()> enter;
};

namespace {

class DriverState final : public SequenceState {
 public:
  DriverState(std::shared_ptr<DriverChannel> ch, uint64_t id, std::unique_ptr<SequenceState> inner)
      : channel(std::move(ch)), id(id), inner(std::move(inner)) {}
  ~DriverState() override {
    {
      std::lock_guard<std::mutex> lk(channel->mu);
      if (!channel->closed) channel->events.push_back(id | kRelease);
    }
    if (channel->enter) (void)channel->enter();
    inner.reset();
  }
  int64_t length() const override { return inner->length(); }
  size_t memory_bytes() const override { return inner->memory_bytes(); }

  std::shared_ptr<DriverChannel> channel;
  uint64_t const id;
  std::unique_ptr<SequenceState> inner;
  Status diverged;  // set under the driver's lock: the replicas differ, only release remains
};

Status with_context(Status const& s, char const* what) {
  return s.ok() ? s : Status(s.code(), std::string(what) + " failed on " + s.message());
}

}  // namespace

RankDriver::RankDriver(LanguageModel& m, dist::Communicator& c, std::shared_ptr<void> keep, std::function<Status()> enter)
    : keep_alive_(std::move(keep)), model_(m), cmd_(c), info_(m.info()), channel_(std::make_shared<DriverChannel>()) {
  channel_->enter = std::move(enter);
  info_.device += ", rank 0 of " + std::to_string(c.size()) + " driving over " + c.name();
}

Result<std::unique_ptr<RankDriver>> RankDriver::create(LanguageModel& rank_model, dist::Communicator& cmd,
                                                       std::shared_ptr<void> keep_alive, std::function<Status()> enter) {
  if (cmd.rank() != 0) return invalid_argument("rank driver: runs on rank 0, the communicator is rank " + std::to_string(cmd.rank()));
  if (cmd.memory_space() != dist::MemorySpace::kHost)
    return invalid_argument("rank driver: the command channel must take host buffers; '" + cmd.name() +
                            "' takes device buffers (wrap it in dist::HostStagingCommunicator)");
  return std::unique_ptr<RankDriver>(new RankDriver(rank_model, cmd, std::move(keep_alive), std::move(enter)));
}

RankDriver::~RankDriver() {
  (void)shutdown();
  std::lock_guard<std::mutex> lk(channel_->mu);
  channel_->closed = true;
}

uint64_t RankDriver::commands_sent() const {
  std::lock_guard<std::mutex> lk(mu_);
  return sent_;
}

Status RankDriver::broken() const {
  std::lock_guard<std::mutex> lk(mu_);
  return broken_;
}

Status RankDriver::send(uint32_t op, std::vector<uint8_t> const& op_payload) {
  if (!broken_.ok()) return Status(broken_.code(), "the rank group is broken: " + broken_.message());
  if (shut_) return invalid_argument("the rank group was shut down");
  Writer w;
  {
    std::lock_guard<std::mutex> lk(channel_->mu);
    w.put<uint64_t>(channel_->events.size());
    for (uint64_t e : channel_->events) w.put(e);
    channel_->events.clear();
  }
  w.put_bytes(op_payload.data(), op_payload.size());
  Status s = send_command(cmd_, op, w.b);
  if (!s.ok()) broken_ = s;
  else ++sent_;
  return s;
}

Status RankDriver::usable(SequenceState const& s, char const* what) const {
  auto const* d = dynamic_cast<DriverState const*>(&s);
  if (!d || d->channel != channel_) return invalid_argument(std::string(what) + ": the state was not created by this rank driver");
  if (!d->diverged.ok())
    return Status(StatusCode::kInternal, std::string(what) + ": the sequence's rank replicas differ since a failed step (" +
                                             d->diverged.message() + "); release it");
  return {};
}

std::unique_ptr<SequenceState> RankDriver::new_sequence() {
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t const id = next_id_++;
  {
    std::lock_guard<std::mutex> ek(channel_->mu);
    channel_->events.push_back(id);
  }
  if (channel_->enter) (void)channel_->enter();  // a failure shows at the first forward
  return std::make_unique<DriverState>(channel_, id, model_.new_sequence());
}

Status RankDriver::forward(std::span<SequenceStep> batch) {
  std::lock_guard<std::mutex> lk(mu_);
  if (batch.empty()) return {};
  // Refused here, before anything is broadcast.
  std::vector<std::pair<DriverState*, int64_t>> len;  // each state's length after the batch
  for (auto const& st : batch) {
    TESSERA_TRY(usable(*st.state, "forward"));
    int64_t const n = static_cast<int64_t>(st.tokens.size());
    if (st.num_logit_rows < 0 || st.num_logit_rows > n)
      return invalid_argument("forward: num_logit_rows " + std::to_string(st.num_logit_rows) + " outside [0, " + std::to_string(n) + "]");
    if (st.num_logit_rows > 0 && !st.logits) return invalid_argument("forward: logits buffer missing");
    for (int32_t t : st.tokens)
      if (t < 0 || t >= info_.vocab_size)
        return invalid_argument("forward: token id " + std::to_string(t) + " outside the vocabulary [0, " +
                                std::to_string(info_.vocab_size) + ")");
    auto* d = static_cast<DriverState*>(st.state);
    auto it = std::find_if(len.begin(), len.end(), [&](auto const& p) { return p.first == d; });
    if (it == len.end()) it = len.insert(len.end(), {d, d->length()});
    it->second += n;
    if (info_.max_context > 0 && it->second > info_.max_context)
      return invalid_argument("forward: sequence would reach " + std::to_string(it->second) +
                              " positions, beyond the model's " + std::to_string(info_.max_context));
  }
  Writer w;
  w.put<uint64_t>(batch.size());
  for (auto const& st : batch) {
    w.put<uint64_t>(static_cast<DriverState*>(st.state)->id);
    w.put<int64_t>(static_cast<int64_t>(st.tokens.size()));
    w.put<int64_t>(st.num_logit_rows);
  }
  for (auto const& st : batch) w.put_bytes(st.tokens.data(), st.tokens.size() * sizeof(int32_t));
  TESSERA_TRY(enter());
  TESSERA_TRY(send(kForward, w.b));
  std::vector<SequenceStep> mine(batch.begin(), batch.end());
  for (auto& st : mine) st.state = static_cast<DriverState*>(st.state)->inner.get();
  Outcome o = forward_everywhere(model_, cmd_, mine, {});
  if (!o.channel.ok()) {
    broken_ = o.channel;
    return with_context(o.channel, "forward (the rank group is now broken)");
  }
  if (o.diverged)
    for (auto& [d, n] : len) d->diverged = o.divergence;
  return with_context(o.group, "forward");
}

Result<std::unique_ptr<SequenceState>> RankDriver::clone(SequenceState const& state) {
  std::lock_guard<std::mutex> lk(mu_);
  TESSERA_TRY(usable(state, "clone"));
  auto const& src = static_cast<DriverState const&>(state);
  uint64_t const id = next_id_++;
  Writer w;
  w.put<uint64_t>(src.id);
  w.put<uint64_t>(id);
  TESSERA_TRY(enter());
  TESSERA_TRY(send(kClone, w.b));
  Status channel;
  auto c = clone_everywhere(model_, cmd_, src.inner.get(), {}, channel);
  if (!channel.ok()) {
    broken_ = channel;
    return with_context(channel, "clone (the rank group is now broken)");
  }
  if (!c) return with_context(c.status(), "clone");
  return std::unique_ptr<SequenceState>(std::make_unique<DriverState>(channel_, id, std::move(*c)));
}

Status RankDriver::truncate(SequenceState& state, int64_t length) {
  std::lock_guard<std::mutex> lk(mu_);
  TESSERA_TRY(usable(state, "truncate"));
  auto& d = static_cast<DriverState&>(state);
  if (length < 0 || length > d.length())
    return invalid_argument("truncate: length " + std::to_string(length) + " outside [0, " + std::to_string(d.length()) + "]");
  Writer w;
  w.put<uint64_t>(d.id);
  w.put<int64_t>(length);
  TESSERA_TRY(enter());
  TESSERA_TRY(send(kTruncate, w.b));
  Outcome o = truncate_everywhere(model_, cmd_, d.inner.get(), length, {});
  if (!o.channel.ok()) {
    broken_ = o.channel;
    return with_context(o.channel, "truncate (the rank group is now broken)");
  }
  if (o.diverged) d.diverged = o.divergence;
  return with_context(o.group, "truncate");
}

Status RankDriver::shutdown() {
  std::lock_guard<std::mutex> lk(mu_);
  if (shut_) return {};
  Status s = broken_.ok() ? send(kShutdown, {}) : broken_;
  shut_ = true;
  return s;
}

Status RankDriver::enter() const { return channel_->enter ? channel_->enter() : Status{}; }

Status shutdown_followers(dist::Communicator& cmd) {
  if (cmd.rank() != 0) return invalid_argument("shutdown_followers: runs on rank 0");
  std::vector<uint8_t> p(sizeof(uint64_t), 0);  // no sequence events
  return send_command(cmd, kShutdown, p);
}

Status follow(LanguageModel& m, dist::Communicator& c) {
  int const me = c.rank();
  if (me == 0) return invalid_argument("follow: rank 0 drives (RankDriver); followers are ranks 1 and up");
  if (c.memory_space() != dist::MemorySpace::kHost)
    return invalid_argument("follow: the command channel must take host buffers; '" + c.name() +
                            "' takes device buffers (wrap it in dist::HostStagingCommunicator)");
  std::string const who = "rank " + std::to_string(me);
  std::unordered_map<uint64_t, std::unique_ptr<SequenceState>> states;
  std::vector<float> scratch;
  int64_t const V = m.info().vocab_size;
  Status desync;  // an event that did not match this rank's table; reported with the next agreement round
  auto find = [&](uint64_t id) -> SequenceState* {
    auto it = states.find(id);
    return it == states.end() ? nullptr : it->second.get();
  };
  auto unknown = [&](uint64_t id) { return Status(StatusCode::kInternal, who + " holds no sequence " + std::to_string(id)); };
  for (;;) {
    auto cmd = receive_command(c);
    if (!cmd) return cmd.status();
    Reader r{cmd->payload};
    uint64_t const events = r.get<uint64_t>();
    for (uint64_t i = 0; i < events && r.ok; ++i) {
      uint64_t const e = r.get<uint64_t>(), id = e & ~kRelease;
      if (e & kRelease) {
        if (states.erase(id) == 0 && desync.ok()) desync = Status(StatusCode::kInternal, who + ": release of unknown sequence " + std::to_string(id));
      } else if (!states.emplace(id, m.new_sequence()).second && desync.ok()) {
        desync = Status(StatusCode::kInternal, who + ": sequence " + std::to_string(id) + " created twice");
      }
    }
    Status local = std::exchange(desync, Status{});
    switch (cmd->op) {
      case kShutdown:
        return {};
      case kForward: {
        uint64_t const n = r.get<uint64_t>();
        if (!r.ok || n > cmd->payload.size()) break;
        std::vector<uint64_t> ids(n);
        std::vector<int64_t> ntok(n), rows(n);
        size_t total_rows = 0, total_tok = 0;
        for (uint64_t i = 0; i < n; ++i) {
          ids[i] = r.get<uint64_t>();
          ntok[i] = r.get<int64_t>();
          rows[i] = r.get<int64_t>();
          if (ntok[i] < 0 || rows[i] < 0 || rows[i] > ntok[i]) r.ok = false;
          total_rows += static_cast<size_t>(rows[i]);
          total_tok += static_cast<size_t>(ntok[i]);
        }
        if (!r.ok || cmd->payload.size() - r.o != total_tok * sizeof(int32_t)) {
          r.ok = false;
          break;
        }
        std::vector<int32_t> toks(total_tok);
        std::memcpy(toks.data(), cmd->payload.data() + r.o, total_tok * sizeof(int32_t));
        scratch.resize(std::max(scratch.size(), total_rows * static_cast<size_t>(V)));
        std::vector<std::unique_ptr<SequenceState>> temp;  // stand-ins for unknown ids: the collectives still line up
        std::vector<SequenceStep> steps(n);
        size_t tok = 0, row = 0;
        for (uint64_t i = 0; i < n; ++i) {
          SequenceState* s = find(ids[i]);
          if (!s) {
            if (local.ok()) local = unknown(ids[i]);
            temp.push_back(m.new_sequence());
            s = temp.back().get();
          }
          steps[i] = {s, std::span<int32_t const>(toks.data() + tok, static_cast<size_t>(ntok[i])), rows[i],
                      rows[i] > 0 ? scratch.data() + row * static_cast<size_t>(V) : nullptr};
          tok += static_cast<size_t>(ntok[i]);
          row += static_cast<size_t>(rows[i]);
        }
        Outcome o = forward_everywhere(m, c, steps, local);
        if (!o.channel.ok()) return o.channel;
        continue;
      }
      case kClone: {
        uint64_t const src = r.get<uint64_t>(), dst = r.get<uint64_t>();
        if (!r.ok) break;
        SequenceState const* s = find(src);
        if (local.ok() && !s) local = unknown(src);
        if (local.ok() && find(dst)) local = Status(StatusCode::kInternal, who + ": clone into existing sequence " + std::to_string(dst));
        Status channel;
        auto cl = clone_everywhere(m, c, s, local, channel);
        if (!channel.ok()) return channel;
        if (cl) states.emplace(dst, std::move(*cl));
        continue;
      }
      case kTruncate: {
        uint64_t const id = r.get<uint64_t>();
        int64_t const len = r.get<int64_t>();
        if (!r.ok) break;
        SequenceState* s = find(id);
        if (local.ok() && !s) local = unknown(id);
        Outcome o = truncate_everywhere(m, c, s, len, local);
        if (!o.channel.ok()) return o.channel;
        continue;
      }
      default:
        return Status(StatusCode::kInternal, who + ": unknown command " + std::to_string(cmd->op) + " from rank 0");
    }
    // A payload this rank cannot parse: it cannot take part in the op's collectives, so the group is lost.
    return Status(StatusCode::kInternal, who + ": malformed command " + std::to_string(cmd->op) + " from rank 0 (" +
                                             std::to_string(cmd->payload.size()) + " payload bytes)");
  }
}

}  // namespace tessera::model
