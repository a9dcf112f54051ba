// SPDX-License-Identifier: Apache-2.0
/// Random walks through a grammar: at each step take the mask, check it is non-empty (no dead end)
/// and, optionally, that every token's mask bit equals what accept_token says; then sample an
/// allowed token from random weights. After `explore` steps the weights favour closing bytes and
/// EOS so walks end.
#pragma once

#include <random>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "tessera/models/common/grammar.hpp"

namespace tessera::verify {

struct WalkResult {
  std::string text;  // bytes of the accepted tokens (EOS excluded)
  bool finished = false;
  int steps = 0;
};

inline WalkResult random_walk(model::GrammarMatcher m, model::GrammarVocabulary const& v,
                              std::mt19937_64& rng, int explore, int max_steps,
                              bool check_every_token) {
  WalkResult r;
  std::vector<uint32_t> mask(v.mask_words());
  std::uniform_real_distribution<double> U(0.0, 1.0);
  std::string
      target;  // a completion found once when the walk starts finishing; followed token by token
  bool have_target = false;
  for (; r.steps < max_steps; ++r.steps) {
    m.fill_mask(mask.data());
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < v.size(); ++id)
      if ((mask[id >> 5] >> (id & 31)) & 1) allowed.push_back(id);
    BOOST_REQUIRE_MESSAGE(!allowed.empty(), "dead end after \"" << r.text << "\"");
    if (check_every_token) {
      for (int32_t id = 0; id < v.size(); ++id) {
        bool const acc = m.accept_token(id);
        if (acc) BOOST_REQUIRE(m.rollback(1));
        bool const bit = (mask[id >> 5] >> (id & 31)) & 1;
        if (acc != bit)
          BOOST_ERROR("mask bit " << bit << " but accept_token " << acc << " for token " << id
                                  << " after \"" << r.text << "\"");
      }
    }
    bool const finishing = r.steps >= explore;
    if (finishing && !have_target) {
      auto c = m.shortest_completion();
      BOOST_REQUIRE_MESSAGE(c.has_value(), "no completion found after \"" << r.text << "\"");
      target = *c;
      have_target = true;
    }
    std::vector<double> w(allowed.size());
    for (size_t i = 0; i < allowed.size(); ++i) {
      int32_t const id = allowed[i];
      double x = U(rng) + 1e-3;
      if (!finishing) {
        if (v.is_eos(id)) x *= 0.02;
      } else if (v.is_eos(id)) {
        x = target.empty() ? 1.0 : 0.0;
      } else {
        std::string const& b = v.token_bytes(id);
        x = (!target.empty() && target.compare(0, b.size(), b) == 0)
                ? x * double(b.size() * b.size())
                : 0.0;
      }
      w[i] = x;
    }
    std::discrete_distribution<size_t> pick(w.begin(), w.end());
    int32_t const id = allowed[pick(rng)];
    BOOST_REQUIRE(m.accept_token(id));
    if (v.is_eos(id)) {
      BOOST_REQUIRE(m.is_terminated());
      r.finished = true;
      return r;
    }
    r.text += v.token_bytes(id);
    if (have_target) target.erase(0, v.token_bytes(id).size());
  }
  return r;
}

}  // namespace tessera::verify
