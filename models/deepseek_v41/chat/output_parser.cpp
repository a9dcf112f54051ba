// SPDX-License-Identifier: Apache-2.0
/// Streaming, tolerant output parser (spec/chat-format.md §3.3–§3.4). A state machine over an input
/// buffer: each state consumes what is already decidable and waits when the buffer's tail could still be
/// the start of a marker, so the concatenated output never depends on how the text was chunked.
///
/// Text states (reasoning, content) scan for markers: `</think>`, `<think>` (dropped inside reasoning),
/// `\n\n<｜DSML｜ calls>` / `<｜DSML｜ calls>` and the V4 `tool_calls` spelling (open a call block), a bare
/// `<｜DSML｜ invoke` (opens a block), EOS (done), BOS and any other `<｜DSML｜` / `</｜DSML｜` / `｜DSML｜`
/// (removed). Call states follow §3.1's grammar, skipping white space between tags; arguments stream as
/// JSON: `{` or `, ` + dumps(key) + `: ` before a value, the value JSON-escaped between quotes for
/// string="true" and raw for string="false", and `}` (or `{}`) when the invoke closes. A call's header
/// delta (its name) is emitted once the name's closing quote arrives. Stop strings are extra text-state
/// markers that end the reply.
#include <span>

#include "tessera/models/deepseek_v41/chat.hpp"

namespace tessera::models::deepseek_v41::chat {

namespace {

enum class Act { kThinkEnd, kThinkStart, kCallsOpen, kOrphanInvoke, kEos, kStrip, kStop };

struct Marker {
  std::string_view text;
  Act act;
};

// Longer spellings first is not required: the scan takes the longest full match at the earliest position.
constexpr Marker kTextMarkers[] = {
    {"</think>", Act::kThinkEnd},
    {"<think>", Act::kThinkStart},
    {"\n\n<｜DSML｜ calls>", Act::kCallsOpen},
    {"<｜DSML｜ calls>", Act::kCallsOpen},
    {"\n\n<｜DSML｜tool_calls>", Act::kCallsOpen},
    {"<｜DSML｜tool_calls>", Act::kCallsOpen},
    {"<｜DSML｜ invoke", Act::kOrphanInvoke},
    {"<｜DSML｜invoke", Act::kOrphanInvoke},
    {"<｜end▁of▁sentence｜>", Act::kEos},
    {"<｜begin▁of▁sentence｜>", Act::kStrip},
    {"</｜DSML｜", Act::kStrip},
    {"<｜DSML｜", Act::kStrip},
    {"｜DSML｜", Act::kStrip},
};

struct ScanResult {
  size_t plain_end;          // [0, plain_end) is definitely plain text
  Marker const* marker;      // full match at plain_end, or null (then either waiting or all plain)
};

/// Earliest full marker match; stops early at a position where a longer marker could still complete.
/// `first` flags the bytes a marker can start with.
ScanResult scan(std::string_view buf, std::span<Marker const> markers, std::array<bool, 256> const& first,
                bool final) {
  size_t const n = buf.size();
  for (size_t i = 0; i < n; ++i) {
    char c = buf[i];
    if (!first[static_cast<unsigned char>(c)]) continue;
    Marker const* best = nullptr;
    bool pending = false;
    for (auto const& m : markers) {
      if (m.text[0] != c) continue;
      if (n - i >= m.text.size()) {
        if (buf.compare(i, m.text.size(), m.text) == 0 && (!best || m.text.size() > best->text.size())) best = &m;
      } else if (!final && m.text.substr(0, n - i) == buf.substr(i)) {
        pending = true;
      }
    }
    if (pending) return {i, nullptr};
    if (best) return {i, best};
  }
  return {n, nullptr};
}

/// Length of the longest suffix of `buf` that is a proper prefix of one of `lits`.
template <size_t N>
size_t held_suffix(std::string_view buf, std::string_view const (&lits)[N]) {
  size_t best = 0;
  for (auto lit : lits)
    for (size_t k = std::min(buf.size(), lit.size() - 1); k > best; --k)
      if (buf.substr(buf.size() - k) == lit.substr(0, k)) {
        best = k;
        break;
      }
  return best;
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/// Consumes `lit` at the front of buf: 1 = consumed, 0 = need more input, -1 = mismatch.
int take(std::string& buf, std::string_view lit, bool final) {
  size_t k = std::min(buf.size(), lit.size());
  if (buf.compare(0, k, lit.substr(0, k)) != 0) return -1;
  if (k < lit.size()) return final ? -1 : 0;
  buf.erase(0, lit.size());
  return 1;
}

void skip_ws(std::string& buf) {
  size_t k = 0;
  while (k < buf.size() && is_ws(buf[k])) ++k;
  buf.erase(0, k);
}

}  // namespace

OutputParser::OutputParser(Options options)
    : options_(std::move(options)), state_(options_.thinking ? State::kReasoning : State::kContent) {
  std::erase_if(options_.stop, [](std::string const& s) { return s.empty(); });
  for (auto const& m : kTextMarkers) first_byte_[static_cast<unsigned char>(m.text[0])] = true;
  for (auto const& s : options_.stop) first_byte_[static_cast<unsigned char>(s[0])] = true;
}

void OutputParser::emit_text(ParseDelta& d, std::string_view s) {
  if (s.empty()) return;
  if (state_ == State::kReasoning) {
    d.reasoning += s;
    msg_.reasoning += s;
  } else {
    d.content += s;
    msg_.content += s;
  }
}

void OutputParser::emit_args(ParseDelta& d, std::string_view s) {
  if (s.empty() || msg_.tool_calls.empty()) return;
  int index = static_cast<int>(msg_.tool_calls.size()) - 1;
  msg_.tool_calls.back().arguments += s;
  // A call's header delta (with its name) keeps empty arguments; fragments follow in separate deltas.
  if (!d.tool_calls.empty() && d.tool_calls.back().index == index && !d.tool_calls.back().begin)
    d.tool_calls.back().arguments += s;
  else d.tool_calls.push_back({index, false, "", std::string(s)});
}

void OutputParser::close_call(ParseDelta& d, bool complete) {
  emit_args(d, call_has_params_ ? "}" : "{}");
  msg_.tool_calls.back().complete = complete;
  call_has_params_ = false;
}

bool OutputParser::step_text(ParseDelta& d, bool final) {
  if (gap_) {
    // Removed input must not splice two halves of a markup spelling together ("｜DS" + "</think>" + "ML｜"):
    // when the emitted text ends with the start of ｜DSML｜ or EOS, the rest of that spelling is dropped.
    gap_ = false;
    junctions_.clear();
    std::string const& acc = state_ == State::kReasoning ? msg_.reasoning : msg_.content;
    for (std::string_view spell : {kDsml, kEos})
      for (size_t k = std::min(acc.size(), spell.size() - 1); k > 0; --k)
        if (std::string_view(acc).substr(acc.size() - k) == spell.substr(0, k))
          junctions_.emplace_back(spell.substr(k));
  }
  if (!junctions_.empty()) {
    if (buf_.empty()) {
      if (!final) return false;   // undecided: wait for more input
      junctions_.clear();
      return false;
    }
    bool wait = false;
    for (auto const& j : junctions_) {
      size_t k = std::min(buf_.size(), j.size());
      if (buf_.compare(0, k, j, 0, k) != 0) continue;
      if (k == j.size() || final) {   // the rest of the spelling (at the very end: what there is of it)
        buf_.erase(0, k);
        junctions_.clear();
        gap_ = true;
        return true;
      }
      wait = true;
    }
    if (wait) return false;
    junctions_.clear();
  }
  std::vector<Marker> with_stops;
  std::span<Marker const> markers = kTextMarkers;
  if (!options_.stop.empty()) {
    with_stops.assign(std::begin(kTextMarkers), std::end(kTextMarkers));
    for (auto const& st : options_.stop) with_stops.push_back({st, Act::kStop});
    markers = with_stops;
  }
  ScanResult r = scan(buf_, markers, first_byte_, final);
  emit_text(d, std::string_view(buf_).substr(0, r.plain_end));
  buf_.erase(0, r.plain_end);
  if (!r.marker) return false;   // all plain text consumed, or waiting on a possible marker
  size_t len = r.marker->text.size();
  gap_ = true;
  switch (r.marker->act) {
    case Act::kThinkEnd:
      buf_.erase(0, len);
      if (state_ == State::kReasoning) state_ = State::kContent;   // in content: a stray </think>, dropped
      return true;
    case Act::kThinkStart:
      if (state_ != State::kReasoning) emit_text(d, r.marker->text);   // in reasoning a repeated <think> is dropped
      buf_.erase(0, len);
      return true;
    case Act::kCallsOpen:
      buf_.erase(0, len);
      state_ = State::kCallsOpen;
      return true;
    case Act::kOrphanInvoke:
      state_ = State::kCallsOpen;   // the call-block state consumes the invoke tag itself
      return true;
    case Act::kEos:
      buf_.clear();
      msg_.saw_eos = true;
      state_ = State::kDone;
      return false;
    case Act::kStrip:
      buf_.erase(0, len);
      return true;
    case Act::kStop:
      for (size_t i = 0; i < options_.stop.size(); ++i)
        if (options_.stop[i].data() == r.marker->text.data()) msg_.stop_index = static_cast<int>(i);
      buf_.clear();
      state_ = State::kDone;
      return false;
  }
  return false;
}

bool OutputParser::step_calls(ParseDelta& d, bool final) {
  static constexpr std::string_view kInvokeOpen[] = {"<｜DSML｜ invoke", "<｜DSML｜invoke"};
  static constexpr std::string_view kInvokeClose[] = {"</｜DSML｜ invoke>", "</｜DSML｜invoke>"};
  static constexpr std::string_view kCallsClose[] = {"</｜DSML｜ calls>", "</｜DSML｜tool_calls>"};
  static constexpr std::string_view kParamOpen[] = {"<｜DSML｜ parameter", "<｜DSML｜parameter"};
  static constexpr std::string_view kValueEnd[] = {"</｜DSML｜ parameter>", "</｜DSML｜parameter>",
                                                   "</｜DSML｜ invoke>", "</｜DSML｜invoke>", "</｜DSML｜ calls>",
                                                   "</｜DSML｜tool_calls>", "<｜end▁of▁sentence｜>"};
  // Tries each literal in `lits` at the front of buf_: index consumed, -2 = wait, -1 = none matches.
  auto take_any = [&](auto const& lits, bool consume) -> int {
    bool wait = false;
    for (size_t i = 0; i < std::size(lits); ++i) {
      std::string_view lit = lits[i];
      size_t k = std::min(buf_.size(), lit.size());
      if (buf_.compare(0, k, lit.substr(0, k)) != 0) continue;
      if (k == lit.size()) {
        if (consume) buf_.erase(0, lit.size());
        return static_cast<int>(i);
      }
      if (!final) wait = true;
    }
    return wait ? -2 : -1;
  };
  bool const in_call = state_ == State::kInvokeHeadEnd || state_ == State::kInvokeBody ||
                       state_ == State::kParamHead || state_ == State::kParamName || state_ == State::kParamAttrs ||
                       state_ == State::kParamValue;
  // Names and values are read verbatim (they look for their own terminators, EOS included).
  bool const verbatim = state_ == State::kInvokeName || state_ == State::kParamName || state_ == State::kParamValue;
  if (!verbatim) {
    skip_ws(buf_);
    if (buf_.empty()) return false;
    if (buf_.starts_with(kEos)) {
      if (in_call) close_call(d, false);
      buf_.clear();
      msg_.saw_eos = true;
      state_ = State::kDone;
      return false;
    }
    if (!final && std::string_view(kEos).starts_with(buf_)) return false;
  }
  static constexpr std::string_view kEosOnly[] = {kEos};
  // Reads a name up to its closing quote into field_: 1 = complete, 0 = need more, -1 = EOS came first.
  auto read_name = [&]() -> int {
    size_t q = buf_.find('"'), e = buf_.find(kEos);
    if (e < q) {
      buf_.clear();
      msg_.saw_eos = true;
      return -1;
    }
    if (q == std::string::npos) {
      size_t keep = final ? 0 : held_suffix(buf_, kEosOnly);
      field_.append(buf_, 0, buf_.size() - keep);
      buf_.erase(0, buf_.size() - keep);
      return 0;
    }
    field_.append(buf_, 0, q);
    buf_.erase(0, q + 1);
    return 1;
  };

  switch (state_) {
    case State::kCallsOpen: {
      int r = take_any(kInvokeOpen, true);
      if (r >= 0) { state_ = State::kInvokeHead; return true; }
      int c = take_any(kCallsClose, true);
      if (c >= 0) { state_ = State::kContent; return true; }
      if (r == -2 || c == -2) return false;
      state_ = State::kContent;   // not DSML: back to content (markup there is removed by the text scan)
      return true;
    }
    case State::kInvokeHead: {
      int r = take(buf_, "name=\"", final);
      if (r == 0) return false;
      if (r < 0) { state_ = State::kContent; return true; }   // malformed head: no call, text is content
      field_.clear();
      state_ = State::kInvokeName;
      return true;
    }
    case State::kInvokeName: {
      int r = read_name();
      if (r < 0) { state_ = State::kDone; return false; }   // EOS inside the name: no call
      if (r == 0) {
        if (final) state_ = State::kContent;   // the name never completed: no call
        return false;
      }
      msg_.tool_calls.push_back({field_, "", true});
      d.tool_calls.push_back({static_cast<int>(msg_.tool_calls.size()) - 1, true, field_, ""});
      call_has_params_ = false;
      state_ = State::kInvokeHeadEnd;
      return true;
    }
    case State::kInvokeHeadEnd: {
      // Normally the very next byte; anything else before the '>' is dropped a byte at a time, so that an
      // EOS in it is seen at the front of the buffer whatever the chunking.
      bool const gt = buf_[0] == '>';
      buf_.erase(0, 1);
      if (gt) state_ = State::kInvokeBody;
      return true;
    }
    case State::kInvokeBody: {
      int p = take_any(kParamOpen, true);
      if (p >= 0) { state_ = State::kParamHead; return true; }
      int e = take_any(kInvokeClose, true);
      if (e >= 0) { close_call(d, true); state_ = State::kCallsOpen; return true; }
      int c = take_any(kCallsClose, true);
      if (c >= 0) { close_call(d, true); state_ = State::kContent; return true; }
      if (p == -2 || e == -2 || c == -2) return false;
      size_t lt = buf_.find('<', 1);   // stray text inside an invoke: dropped up to the next '<'
      buf_.erase(0, lt == std::string::npos ? buf_.size() : lt);
      return !buf_.empty();
    }
    case State::kParamHead: {
      int r = take(buf_, "name=\"", final);
      if (r == 0) return false;
      if (r < 0) { state_ = State::kInvokeBody; return true; }
      field_.clear();
      state_ = State::kParamName;
      return true;
    }
    case State::kParamName: {
      int r = read_name();
      if (r < 0) {   // EOS inside the key: the call ends with the parameters it had
        close_call(d, false);
        state_ = State::kDone;
        return false;
      }
      if (r == 0) return false;
      state_ = State::kParamAttrs;
      return true;
    }
    case State::kParamAttrs: {
      static constexpr std::string_view kAttrs[] = {"string=\"true\">", "string=\"false\">", ">"};
      int r = take_any(kAttrs, true);
      if (r == -2) return false;
      if (r == -1) {   // an unexpected byte before the attributes: dropped, then look again
        buf_.erase(0, 1);
        return true;
      }
      param_is_string_ = r != 1;
      std::string head = (call_has_params_ ? ", " : "{") + python_json_string(field_) + ": ";
      if (param_is_string_) head += '"';
      call_has_params_ = true;
      emit_args(d, head);
      state_ = State::kParamValue;
      return true;
    }
    case State::kParamValue: {
      size_t end = std::string::npos, which = 0;
      for (size_t i = 0; i < std::size(kValueEnd); ++i) {
        size_t at = buf_.find(kValueEnd[i]);
        if (at < end) end = at, which = i;
      }
      size_t take_n = end != std::string::npos ? end : final ? buf_.size() : buf_.size() - held_suffix(buf_, kValueEnd);
      std::string_view v = std::string_view(buf_).substr(0, take_n);
      if (param_is_string_) {
        std::string esc = python_json_string(v);
        emit_args(d, std::string_view(esc).substr(1, esc.size() - 2));
      } else {
        emit_args(d, v);
      }
      buf_.erase(0, take_n);
      if (end == std::string::npos && !final) return false;
      if (param_is_string_) emit_args(d, "\"");
      if (end != std::string::npos && which < 2) buf_.erase(0, kValueEnd[which].size());
      state_ = State::kInvokeBody;   // an invoke/calls close or EOS is handled there
      return true;
    }
    default:
      return false;
  }
}

bool OutputParser::step(ParseDelta& d, bool final) {
  if (state_ == State::kDone) {
    buf_.clear();
    return false;
  }
  if (state_ == State::kReasoning || state_ == State::kContent) return step_text(d, final);
  bool more = step_calls(d, final);
  if (state_ == State::kReasoning || state_ == State::kContent) gap_ = true;
  return more;
}

ParseDelta OutputParser::feed(std::string_view text) {
  ParseDelta d;
  if (state_ == State::kDone) return d;
  buf_ += text;
  while (step(d, false)) {}
  return d;
}

ParseDelta OutputParser::finish() {
  ParseDelta d;
  while (step(d, true)) {}
  // The output ended inside a call: close its arguments so they stay valid JSON text.
  bool in_call = state_ == State::kInvokeHeadEnd || state_ == State::kInvokeBody || state_ == State::kParamHead ||
                 state_ == State::kParamName || state_ == State::kParamAttrs || state_ == State::kParamValue;
  if (in_call) close_call(d, false);
  state_ = State::kDone;
  buf_.clear();
  return d;
}

}  // namespace tessera::models::deepseek_v41::chat
