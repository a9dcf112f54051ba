// SPDX-License-Identifier: Apache-2.0
/// Multi-process serving's protocol (models/common/rank_driver.hpp) with the ranks as threads over the
/// in-process communicator: rank 0's RankDriver over its CPU rank model of golden/v41-tiny fp32, the other
/// ranks in `follow`, at TP = EP = 2 (gather) and TP 4 (head gather), both exact plans:
///  * prefill chunks, batched steps of several sequences, greedy decode, clone, truncate, release and a new
///    sequence after a release: every logit bit for bit equal to the single-rank model doing the same calls;
///  * bad input is refused on rank 0 with nothing broadcast, and the group goes on;
///  * a failing step (a truncate past max_rollback on every rank; an injected forward / clone failure on a
///    follower or on rank 0, reported after the rank ran the call) fails on rank 0, leaves every rank's states
///    as before, and the same step afterwards gives the single-rank logits; a failure that cannot be rolled
///    back marks the sequence, which is then refused, while the others go on;
///  * shutdown (explicit or by the driver's destruction) ends every follower with success.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <random>

#include "tessera/models/deepseek_v41/golden_gate.hpp"
#include "verify/dist/rank_group.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model;
using namespace tessera::model::dsv41;
using verify::RankGroup;

namespace {

dist::ParallelConfig cfg(int tp, int ep) {
  dist::ParallelConfig c;
  c.tp = tp;
  c.ep = ep;
  c.attn = dist::AttnCombine::kGather;
  return c;
}

std::vector<int32_t> toks(uint64_t seed, size_t n) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(g() % 512);
  return t;
}

struct Req {
  SequenceState* st;
  std::vector<int32_t> tokens;
  int64_t rows;
};

/// One batched forward; its logits rows back to back (or the error).
Result<std::vector<float>> step(LanguageModel& m, std::vector<Req> const& reqs) {
  int64_t const V = m.info().vocab_size;
  size_t rows = 0;
  for (auto const& r : reqs) rows += static_cast<size_t>(r.rows);
  std::vector<float> lg(rows * static_cast<size_t>(V));
  std::vector<SequenceStep> steps;
  size_t off = 0;
  for (auto const& r : reqs) {
    steps.push_back({r.st, r.tokens, r.rows, r.rows ? lg.data() + off : nullptr});
    off += static_cast<size_t>(r.rows * V);
  }
  TESSERA_TRY(m.forward(steps));
  return lg;
}

/// The greedy token of logits row `row`.
int32_t greedy(std::vector<float> const& lg, int64_t V, size_t row) {
  return static_cast<int32_t>(argmax_first(lg.data() + row * static_cast<size_t>(V), V));
}

/// A fixed schedule of every state-touching call; every logit appended to the result.
std::vector<float> scenario(LanguageModel& m) {
  int64_t const V = m.info().vocab_size;
  std::vector<float> all;
  auto run = [&](std::vector<Req> const& r) {
    auto lg = step(m, r).value_or_throw();
    all.insert(all.end(), lg.begin(), lg.end());
    return lg;
  };
  auto a = m.new_sequence(), b = m.new_sequence(), c = m.new_sequence();
  run({{a.get(), toks(1, 7), 7}});                                       // a prefill chunk, every row
  run({{b.get(), toks(2, 5), 1}, {c.get(), toks(3, 9), 2}});             // two prefills in one batch
  auto lg = run({{a.get(), toks(4, 4), 2}, {b.get(), toks(5, 1), 1}, {c.get(), toks(6, 3), 1}});
  int32_t na = greedy(lg, V, 1), nb = greedy(lg, V, 2), nc = greedy(lg, V, 3);
  for (int i = 0; i < 4; ++i) {  // greedy decode of three sequences together
    lg = run({{a.get(), {na}, 1}, {b.get(), {nb}, 1}, {c.get(), {nc}, 1}});
    na = greedy(lg, V, 0), nb = greedy(lg, V, 1), nc = greedy(lg, V, 2);
  }
  auto d = m.clone(*a).value_or_throw();  // a fork continues both ways
  int32_t nd = na;
  for (int i = 0; i < 3; ++i) {
    lg = run({{d.get(), {nd}, 1}, {a.get(), {na}, 1}});
    nd = greedy(lg, V, 0), na = greedy(lg, V, 1);
  }
  throw_if_error(m.truncate(*b, b->length() - 3));  // b rolls back three tokens and decodes another way
  nb = (nb + 7) % 512;
  for (int i = 0; i < 3; ++i) {
    lg = run({{b.get(), {nb}, 1}});
    nb = greedy(lg, V, 0);
  }
  c.reset();  // released; a new sequence after it
  auto e = m.new_sequence();
  lg = run({{e.get(), toks(7, 6), 1}, {d.get(), {nd}, 1}});
  int32_t ne = greedy(lg, V, 0);
  for (int i = 0; i < 2; ++i) {
    lg = run({{e.get(), {ne}, 1}});
    ne = greedy(lg, V, 0);
  }
  for (auto* s : {a.get(), b.get(), d.get(), e.get()}) all.push_back(static_cast<float>(s->length()));
  return all;
}

bool bits_equal(std::vector<float> const& x, std::vector<float> const& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

Status internal_error_for_test() { return Status(StatusCode::kInternal, "follow did not return"); }

std::string str(dist::ParallelConfig const& c) { return "tp " + std::to_string(c.tp) + " ep " + std::to_string(c.ep); }

}  // namespace

BOOST_AUTO_TEST_SUITE(dist_rank_driver)

BOOST_AUTO_TEST_CASE(driver_equals_single_rank) {
  Dsv41Model& one = verify::tiny_model("fp32");
  auto const base = scenario(one);
  for (auto c : {cfg(2, 2), cfg(4, 1)}) {
    RankGroup g(one, c);
    auto got = scenario(*g.driver);
    BOOST_TEST(bits_equal(got, base), str(c) << ": " << got.size() << " values");
    BOOST_TEST(g.driver->commands_sent() == 18u, str(c) << ": " << g.driver->commands_sent());  // 16 forwards, a clone, a truncate; the shutdown below
    Status s = g.stop();
    BOOST_TEST(s.ok(), str(c) << ": " << s.message());
    BOOST_TEST(g.driver->commands_sent() == 19u, str(c));
    BOOST_TEST(g.entered >= 18, str(c));  // every forward, clone and truncate; new and released sequences
  }
}

BOOST_AUTO_TEST_CASE(bad_input_refused_before_broadcast) {
  Dsv41Model& one = verify::tiny_model("fp32");
  RankGroup g(one, cfg(2, 2));
  RankDriver& d = *g.driver;
  int64_t const V = one.info().vocab_size, P = one.info().max_context;
  auto a = d.new_sequence();
  throw_if_error(step(d, {{a.get(), toks(11, 5), 1}}).status());
  uint64_t const sent = d.commands_sent();
  auto foreign = one.new_sequence();
  std::vector<float> lg(static_cast<size_t>(V));
  auto refused = [&](Status const& s, char const* what) {
    BOOST_TEST((s.code() == StatusCode::kInvalidArgument), what << ": " << s.to_string());
    BOOST_TEST(d.commands_sent() == sent, what);
  };
  refused(step(d, {{a.get(), toks(12, static_cast<size_t>(P - 4)), 1}}).status(), "past max_position_embeddings");
  refused(step(d, {{a.get(), toks(12, static_cast<size_t>(P / 2)), 1}, {a.get(), toks(13, static_cast<size_t>(P / 2)), 1}}).status(),
          "one state twice, past max_position_embeddings together");
  refused(step(d, {{a.get(), {3, static_cast<int32_t>(V)}, 1}}).status(), "token outside the vocabulary");
  refused(step(d, {{a.get(), {3}, 2}}).status(), "more logit rows than tokens");
  SequenceStep no_buf{a.get(), std::span<int32_t const>(), 0, nullptr};
  std::vector<int32_t> one_tok{3};
  no_buf.tokens = one_tok;
  no_buf.num_logit_rows = 1;
  refused(d.forward(std::span<SequenceStep>(&no_buf, 1)), "logits buffer missing");
  refused(step(d, {{foreign.get(), {3}, 1}}).status(), "a state of another model");
  refused(d.truncate(*a, a->length() + 1), "truncate past the length");
  refused(d.clone(*foreign).status(), "clone of a foreign state");
  BOOST_TEST(a->length() == 5);
  // The group goes on: the same sequence continues as on one rank.
  auto ref = one.new_sequence();
  auto want = step(one, {{ref.get(), toks(11, 5), 1}}).value_or_throw();
  want = step(one, {{ref.get(), toks(14, 3), 3}}).value_or_throw();
  auto got = step(d, {{a.get(), toks(14, 3), 3}}).value_or_throw();
  BOOST_TEST(bits_equal(got, want));
  Status s = g.stop();
  BOOST_TEST(s.ok(), s.message());
}

BOOST_AUTO_TEST_CASE(failed_steps_roll_back_on_every_rank) {
  Dsv41Model& one = verify::tiny_model("fp32");
  for (auto c : {cfg(2, 2), cfg(4, 1)}) {
    RankGroup g(one, c);
    RankDriver& d = *g.driver;
    int const W = static_cast<int>(g.ranks.size());
    auto a = d.new_sequence(), b = d.new_sequence();
    auto ra = one.new_sequence(), rb = one.new_sequence();
    auto both = [&](LanguageModel& m, SequenceState* x, SequenceState* y, uint64_t seed) {
      return step(m, {{x, toks(seed, 3), 2}, {y, toks(seed + 100, 1), 1}});
    };
    auto check = [&](uint64_t seed, char const* what) {
      auto want = both(one, ra.get(), rb.get(), seed).value_or_throw();
      auto got = both(d, a.get(), b.get(), seed);
      BOOST_TEST_REQUIRE(got.ok(), str(c) << " " << what << ": " << got.status().message());
      BOOST_TEST(bits_equal(*got, want), str(c) << " " << what);
    };
    check(21, "first step");
    // A forward that fails on the last follower after it ran (its collectives done): rank 0 gets the error,
    // every rank rolls the batch back, and the same step then matches one rank.
    g.faulty[W - 1]->fail_next_forward = true;
    auto f = both(d, a.get(), b.get(), 22);
    BOOST_TEST(!f.ok(), str(c));
    BOOST_TEST(f.status().message().find("rank " + std::to_string(W - 1) + ": injected forward failure") != std::string::npos,
               f.status().message());
    BOOST_TEST(a->length() == 3);
    BOOST_TEST(b->length() == 1);
    check(22, "after a follower's failed forward");
    // The same on rank 0.
    g.faulty[0]->fail_next_forward = true;
    f = both(d, a.get(), b.get(), 23);
    BOOST_TEST(f.status().message().find("rank 0: injected forward failure") != std::string::npos, f.status().message());
    check(23, "after rank 0's failed forward");
    // A truncate past max_rollback (64) fails on every rank and changes nothing.
    auto e = d.new_sequence();
    auto re = one.new_sequence();
    throw_if_error(step(d, {{e.get(), toks(24, 80), 1}}).status());
    throw_if_error(step(one, {{re.get(), toks(24, 80), 1}}).status());
    Status t = d.truncate(*e, 10);
    BOOST_TEST((t.code() == StatusCode::kNotSupported), t.to_string());
    BOOST_TEST(e->length() == 80);
    auto want = step(one, {{re.get(), toks(25, 2), 2}}).value_or_throw();
    BOOST_TEST(bits_equal(step(d, {{e.get(), toks(25, 2), 2}}).value_or_throw(), want), str(c) << " after a failed truncate");
    // A clone that fails on a follower is dropped everywhere; the next clone works.
    g.faulty[1]->fail_next_clone = true;
    auto cl = d.clone(*a);
    BOOST_TEST(!cl.ok());
    BOOST_TEST(cl.status().message().find("rank 1: injected clone failure") != std::string::npos, cl.status().message());
    auto a2 = d.clone(*a).value_or_throw();
    auto ra2 = one.clone(*ra).value_or_throw();
    want = step(one, {{ra2.get(), toks(26, 2), 1}}).value_or_throw();
    BOOST_TEST(bits_equal(step(d, {{a2.get(), toks(26, 2), 1}}).value_or_throw(), want), str(c) << " after a failed clone");
    check(27, "the clone's source after it");
    // Failures that cannot be rolled back: a 70-token forward reported failed after it ran (max_rollback 64),
    // a truncate that succeeds on some ranks only. The sequence is refused from then on with nothing
    // broadcast; the others go on; releasing it is fine.
    auto h = d.new_sequence(), k = d.clone(*a).value_or_throw();
    g.faulty[1]->fail_next_forward = true;
    Status hf = step(d, {{h.get(), toks(28, 70), 1}}).status();
    BOOST_TEST(hf.message().find("injected forward failure") != std::string::npos, hf.message());
    g.faulty[W - 1]->fail_next_truncate = true;
    Status kt = d.truncate(*k, k->length() - 1);
    BOOST_TEST(kt.message().find("injected truncate failure") != std::string::npos, kt.message());
    uint64_t const sent = d.commands_sent();
    for (auto* x : {h.get(), k.get()}) {
      Status r = step(d, {{x, {5}, 1}}).status();
      BOOST_TEST(r.message().find("replicas differ") != std::string::npos, str(c) << ": " << r.message());
      BOOST_TEST(d.clone(*x).status().message().find("replicas differ") != std::string::npos);
    }
    BOOST_TEST(d.commands_sent() == sent);
    h.reset();
    k.reset();
    check(29, "after releasing the diverged sequences");
    Status s = g.stop();
    BOOST_TEST(s.ok(), str(c) << ": " << s.message());
  }
}

BOOST_AUTO_TEST_CASE(shutdown_ends_followers) {
  Dsv41Model& one = verify::tiny_model("fp32");
  {
    RankGroup g(one, cfg(2, 2));
    auto a = g.driver->new_sequence();
    throw_if_error(step(*g.driver, {{a.get(), toks(31, 4), 1}}).status());
    Status s = g.stop();
    BOOST_TEST(s.ok(), s.message());
    uint64_t const sent = g.driver->commands_sent();
    BOOST_TEST(!step(*g.driver, {{a.get(), {1}, 1}}).ok());
    BOOST_TEST(g.driver->shutdown().ok());  // idempotent
    BOOST_TEST(g.driver->commands_sent() == sent);
  }
  {
    // The driver's destruction shuts the group down; a state outliving it is released quietly.
    RankGroup g(one, cfg(4, 1));
    auto a = g.driver->new_sequence();
    throw_if_error(step(*g.driver, {{a.get(), toks(32, 4), 1}}).status());
    g.driver.reset();
    for (auto& t : g.threads) t.join();
    for (size_t r = 1; r < g.follower_status.size(); ++r) BOOST_TEST(g.follower_status[r].ok(), g.follower_status[r].message());
  }
  // Rank 0 without a driver (its start-up failed) still ends the followers; roles are checked.
  auto comms = dist::InProcessCommunicator::create(2);
  Status fs = internal_error_for_test();
  std::thread t([&] { fs = follow(one, *comms[1]); });
  BOOST_TEST(shutdown_followers(*comms[0]).ok());
  t.join();
  BOOST_TEST(fs.ok(), fs.message());
  BOOST_TEST((RankDriver::create(one, *comms[1]).status().code() == StatusCode::kInvalidArgument));
  BOOST_TEST((follow(one, *comms[0]).code() == StatusCode::kInvalidArgument));
  BOOST_TEST((shutdown_followers(*comms[1]).code() == StatusCode::kInvalidArgument));
}

BOOST_AUTO_TEST_SUITE_END()
