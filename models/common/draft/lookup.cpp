// SPDX-License-Identifier: Apache-2.0
/// Prompt-lookup / n-gram copy drafter: for n = max_ngram down to min_ngram, the suffix s of n tokens
/// of the committed sequence is searched for at earlier starts j (latest first, j + n < length); the
/// first hit proposes committed[j + n … j + n + k). Copies may run into the suffix itself, so a
/// period-p repetition drafts the whole k.
#include <algorithm>

#include "tessera/models/common/drafter.hpp"

namespace tessera::model {

namespace {

class LookupDrafter final : public Drafter {
 public:
  explicit LookupDrafter(LookupOptions o) : o_(o) {}
  std::string name() const override { return "lookup"; }
  Draft propose(std::span<int32_t const> c, int64_t max_k) override {
    Draft d;
    int64_t const len = static_cast<int64_t>(c.size());
    if (max_k <= 0) return d;
    for (int64_t n = std::min(o_.max_ngram, len - 1); n >= o_.min_ngram; --n) {
      auto const suffix = c.subspan(static_cast<size_t>(len - n));
      for (int64_t j = len - n - 1; j >= 0; --j) {
        if (!std::equal(suffix.begin(), suffix.end(), c.begin() + j)) continue;
        for (int64_t i = j + n; i < len && static_cast<int64_t>(d.tokens.size()) < max_k; ++i) d.tokens.push_back(c[i]);
        d.confidence.assign(d.tokens.size(), -1.f);
        return d;
      }
    }
    return d;
  }

 private:
  LookupOptions o_;
};

}  // namespace

std::unique_ptr<Drafter> make_lookup_drafter(LookupOptions opts) { return std::make_unique<LookupDrafter>(opts); }

}  // namespace tessera::model
