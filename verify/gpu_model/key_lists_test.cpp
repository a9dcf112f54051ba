// SPDX-License-Identifier: Apache-2.0
/// gpu::build_key_lists (the sink attention's CSR key lists over the pool [old window rows | chunk rows |
/// compressed entries], spec §2.5.5) on the backend under test against a plain construction written here:
/// per query row the visible window rows, the chunk rows j ≤ r inside the window, then the valid selections in
/// ascending entry order (all entries in the pool, or each row's own selection slots with its gather table);
/// the bf16 logit-row columns and sink columns. Up to 2,600 rows per call (the CUDA scan runs over chunks of
/// 1,024 rows), selections with −1 padding, ids ≥ T and rows without any; and one sequence's lists at pass-wide
/// bases (KeyListParams::id_base, slot_base, row_begin / row_end); and build_key_lists_batched, many sequences'
/// lists in one call at fixed slots per row (KeyListParams::row_cap).
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "models/deepseek_v41/gpu_internal.hpp"
#include "verify/gpu_model/gpu_model_fixture.hpp"

using namespace tessera;
using namespace tessera::model::dsv41;

namespace {

constexpr Backend kBackend = verify::kGpuModelOnCpu ? Backend::kCpu : Backend::kCuda;

struct Lists {
  std::vector<int64_t> offsets;
  std::vector<int32_t> ids, cols, sinks, gather;
  std::vector<int64_t> begin, end;  // row_begin / row_end (with bases)
};

/// KeyListParams' pass-wide bases (id_base, slot_base, row_begin / row_end); zero: one sequence alone.
struct Bases {
  int64_t id = 0, slot = 0;
};

struct Case {
  int64_t rows, pos0, n_old, window, top_k, entries, src_ratio;
  bool compact;
  std::vector<int32_t> selected;  // [rows, top_k]
};

Lists plain(Case const& c) {
  Lists o;
  o.offsets.push_back(0);
  if (c.compact) o.gather.assign(static_cast<size_t>(c.rows * c.top_k), -1);
  int64_t const wpos0 = c.pos0 - c.n_old;
  for (int64_t r = 0; r < c.rows; ++r) {
    int64_t const p = c.pos0 + r;
    std::vector<std::pair<int32_t, int32_t>> keys;  // (pool id, column)
    for (int64_t i = 0; i < c.n_old; ++i)
      if (wpos0 + i > p - c.window) keys.push_back({static_cast<int32_t>(i), static_cast<int32_t>(wpos0 + i)});
    for (int64_t j = 0; j <= r; ++j)
      if (c.pos0 + j > p - c.window) keys.push_back({static_cast<int32_t>(c.n_old + j), static_cast<int32_t>(c.pos0 + j)});
    std::vector<int32_t> sel;
    for (int64_t k = 0; k < c.top_k; ++k) {
      int32_t const e = c.selected[static_cast<size_t>(r * c.top_k + k)];
      if (e >= 0 && e < c.entries) sel.push_back(e);
    }
    std::sort(sel.begin(), sel.end());
    for (size_t k = 0; k < sel.size(); ++k) {
      int64_t const id = c.compact ? c.n_old + c.rows + r * c.top_k + static_cast<int64_t>(k) : c.n_old + c.rows + sel[k];
      keys.push_back({static_cast<int32_t>(id), static_cast<int32_t>(p + 1 + sel[k])});
      if (c.compact) o.gather[static_cast<size_t>(r * c.top_k) + k] = sel[k];
    }
    for (auto [id, col] : keys) {
      o.ids.push_back(id);
      o.cols.push_back(col);
    }
    o.offsets.push_back(static_cast<int64_t>(o.ids.size()));
    o.sinks.push_back(static_cast<int32_t>(p + 1 + (p + 1) / c.src_ratio));
  }
  return o;
}

Lists on_backend(gpu::Mem const& mem, Case const& c, Bases bases = {}) {
  using Copy = gpu::Mem::Copy;
  int64_t const cap = c.rows * (c.window + c.top_k);
  std::vector<void*> blocks;
  auto put = [&](void const* host, size_t bytes) {
    void* d = mem.alloc(std::max<size_t>(bytes, 8)).value_or_throw();
    blocks.push_back(d);
    if (host) throw_if_error(mem.copy(d, host, bytes, Copy::kHostToDev));
    return d;
  };
  std::vector<int32_t> fill(static_cast<size_t>(cap), -9);
  gpu::KeyListParams p;
  p.rows = c.rows;
  p.pos0 = c.pos0;
  p.n_old = c.n_old;
  p.wpos0 = c.pos0 - c.n_old;
  p.window = c.window;
  p.selected = static_cast<int32_t const*>(put(c.selected.data(), c.selected.size() * 4));
  p.top_k = c.top_k;
  p.entries = c.entries;
  p.offsets = static_cast<int64_t*>(put(nullptr, static_cast<size_t>(c.rows + 1) * 8));
  p.counts = static_cast<int64_t*>(put(nullptr, static_cast<size_t>(c.rows) * 8));
  p.key_ids = static_cast<int32_t*>(put(fill.data(), fill.size() * 4));
  p.key_cols = static_cast<int32_t*>(put(fill.data(), fill.size() * 4));
  p.id_base = bases.id;
  p.slot_base = bases.slot;
  if (bases.id != 0 || bases.slot != 0) {
    p.row_begin = static_cast<int64_t*>(put(nullptr, static_cast<size_t>(c.rows) * 8));
    p.row_end = static_cast<int64_t*>(put(nullptr, static_cast<size_t>(c.rows) * 8));
  }
  p.sink_cols = static_cast<int32_t*>(put(fill.data(), static_cast<size_t>(c.rows) * 4));
  p.src_ratio = c.src_ratio;
  if (c.compact) p.gather = static_cast<int32_t*>(put(fill.data(), static_cast<size_t>(c.rows * c.top_k) * 4));
  throw_if_error(gpu::build_key_lists(mem, p));
  Lists o;
  o.offsets.resize(static_cast<size_t>(c.rows + 1));
  throw_if_error(mem.copy(o.offsets.data(), p.offsets, o.offsets.size() * 8, Copy::kDevToHost));
  throw_if_error(mem.sync());
  int64_t const n = o.offsets.back();
  BOOST_REQUIRE(n >= 0);
  BOOST_REQUIRE(n <= cap);
  o.ids.resize(static_cast<size_t>(n));
  o.cols.resize(static_cast<size_t>(n));
  o.sinks.resize(static_cast<size_t>(c.rows));
  throw_if_error(mem.copy(o.ids.data(), p.key_ids, o.ids.size() * 4, Copy::kDevToHost));
  throw_if_error(mem.copy(o.cols.data(), p.key_cols, o.cols.size() * 4, Copy::kDevToHost));
  throw_if_error(mem.copy(o.sinks.data(), p.sink_cols, o.sinks.size() * 4, Copy::kDevToHost));
  if (c.compact) {
    o.gather.resize(static_cast<size_t>(c.rows * c.top_k));
    throw_if_error(mem.copy(o.gather.data(), p.gather, o.gather.size() * 4, Copy::kDevToHost));
  }
  if (p.row_begin) {
    o.begin.resize(static_cast<size_t>(c.rows));
    o.end.resize(static_cast<size_t>(c.rows));
    throw_if_error(mem.copy(o.begin.data(), p.row_begin, o.begin.size() * 8, Copy::kDevToHost));
    throw_if_error(mem.copy(o.end.data(), p.row_end, o.end.size() * 8, Copy::kDevToHost));
  }
  throw_if_error(mem.sync());
  for (void* b : blocks) mem.free(b);
  return o;
}

Case make_case(int64_t rows, int64_t pos0, int64_t n_old, int64_t window, int64_t top_k, int64_t entries, bool compact,
               uint32_t seed) {
  Case c{rows, pos0, n_old, window, top_k, entries, 2, compact, {}};
  std::mt19937 g(seed);
  c.selected.resize(static_cast<size_t>(rows * top_k));
  for (int64_t r = 0; r < rows; ++r) {
    // Distinct ids per row, some −1 and some ≥ entries (dropped); every 7th row selects nothing.
    std::vector<int32_t> pool(static_cast<size_t>(entries + 8));
    for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<int32_t>(i);
    std::shuffle(pool.begin(), pool.end(), g);
    for (int64_t k = 0; k < top_k; ++k) {
      int32_t v = k < static_cast<int64_t>(pool.size()) ? pool[static_cast<size_t>(k)] : -1;
      if (r % 7 == 3 || g() % 5 == 0) v = -1;
      c.selected[static_cast<size_t>(r * top_k + k)] = v;
    }
  }
  return c;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(key_lists)

BOOST_AUTO_TEST_CASE(backend_equals_plain_construction) {
  gpu::Mem mem;
  mem.backend = kBackend;
  DeviceInfo info;
  throw_if_error(mem.open(&info));
  int checked = 0;
  for (bool compact : {false, true})
    for (auto [rows, n_old] : {std::pair<int64_t, int64_t>{1, 127}, {5, 40}, {1024, 0}, {1025, 127}, {2600, 90}}) {
      Case const c = make_case(rows, 5000, n_old, 128, 24, 300, compact, static_cast<uint32_t>(rows * 3 + n_old));
      Lists const want = plain(c), got = on_backend(mem, c);
      std::string const what = "rows " + std::to_string(rows) + " n_old " + std::to_string(n_old) +
                               (compact ? " compact" : " all entries");
      BOOST_TEST(got.offsets == want.offsets, what);
      BOOST_TEST(got.ids == want.ids, what);
      BOOST_TEST(got.cols == want.cols, what);
      BOOST_TEST(got.sinks == want.sinks, what);
      BOOST_TEST(got.gather == want.gather, what);
      ++checked;
    }
  BOOST_TEST(checked == 10);
  mem.close();
}

// A sequence's lists inside a pass-wide key pool and key_ids (one attention call over several sequences): every
// id shifted by id_base, the columns as without it, and row_begin / row_end = slot_base + the local offsets.
BOOST_AUTO_TEST_CASE(bases_shift_ids_and_ranges) {
  gpu::Mem mem;
  mem.backend = kBackend;
  DeviceInfo info;
  throw_if_error(mem.open(&info));
  for (bool compact : {false, true})
    for (auto [rows, n_old] : {std::pair<int64_t, int64_t>{1, 127}, {1025, 60}}) {
      Case const c = make_case(rows, 5000, n_old, 128, 24, 300, compact, static_cast<uint32_t>(rows * 5 + n_old));
      Lists const want = plain(c);
      Bases const b{1000 + rows, 37 * rows};
      Lists const got = on_backend(mem, c, b);
      std::string const what = "rows " + std::to_string(rows) + (compact ? " compact" : " all entries");
      std::vector<int32_t> ids = want.ids;
      for (int32_t& id : ids) id = static_cast<int32_t>(id + b.id);
      std::vector<int64_t> begin(static_cast<size_t>(rows)), end(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        begin[static_cast<size_t>(r)] = b.slot + want.offsets[static_cast<size_t>(r)];
        end[static_cast<size_t>(r)] = b.slot + want.offsets[static_cast<size_t>(r) + 1];
      }
      BOOST_TEST(got.offsets == want.offsets, what);
      BOOST_TEST(got.ids == ids, what);
      BOOST_TEST(got.cols == want.cols, what);
      BOOST_TEST(got.sinks == want.sinks, what);
      BOOST_TEST(got.gather == want.gather, what);
      BOOST_TEST(got.begin == begin, what);
      BOOST_TEST(got.end == end, what);
    }
  mem.close();
}

// Many sequences' lists in one build_key_lists_batched call (three launches of up to kKeyListBatch on CUDA): each
// row's list at slot slot_base + r·row_cap, ids shifted by id_base, the columns, sinks and gather slots of the
// plain construction, row_end − row_begin its length; the slots between lists are left alone; the unpack list of
// each sequence's compressed part (its slots or entries, at its table offset, to its pool rows).
BOOST_AUTO_TEST_CASE(batched_rows_at_fixed_slots) {
  using Copy = gpu::Mem::Copy;
  gpu::Mem mem;
  mem.backend = kBackend;
  DeviceInfo info;
  throw_if_error(mem.open(&info));
  std::vector<Case> cases;
  for (int i = 0; i < 2 * gpu::kKeyListBatch + 3; ++i) {  // decode rows mostly, a few chunks; some without selections
    int64_t const rows = i % 5 == 4 ? 37 : 1, n_old = (i * 29) % 128;
    cases.push_back(make_case(rows, 3000 + 11 * i, n_old, 128, 24, 40 + 13 * i, i % 3 == 1, static_cast<uint32_t>(900 + i)));
    if (i % 6 == 5) cases.back().selected.clear();
  }
  std::vector<void*> blocks;
  auto put = [&](void const* host, size_t bytes) {
    void* d = mem.alloc(std::max<size_t>(bytes, 8)).value_or_throw();
    blocks.push_back(d);
    if (host) throw_if_error(mem.copy(d, host, bytes, Copy::kHostToDev));
    return d;
  };
  int64_t total_rows = 0, total_slots = 0, id_base = 0;
  std::vector<gpu::KeyListParams> ps;
  std::vector<int64_t> row0s;
  for (Case const& c : cases) {
    gpu::KeyListParams p;
    p.rows = c.rows;
    p.pos0 = c.pos0;
    p.n_old = c.n_old;
    p.wpos0 = c.pos0 - c.n_old;
    p.window = c.window;
    p.selected = c.selected.empty() ? nullptr : static_cast<int32_t const*>(put(c.selected.data(), c.selected.size() * 4));
    p.top_k = c.top_k;
    p.entries = c.entries;
    p.row_cap = c.window + (p.selected ? c.top_k : 0);
    p.src_ratio = c.src_ratio;
    p.id_base = id_base;
    p.slot_base = total_slots;
    if (c.compact && p.selected) p.gather = static_cast<int32_t*>(put(nullptr, static_cast<size_t>(c.rows * c.top_k) * 4));
    if (p.selected) {  // the unpack list of the compressed part, its stored rows at a per-sequence table offset
      size_t const n = static_cast<size_t>(p.gather ? c.rows * c.top_k : c.entries);
      p.unpack_src = static_cast<int32_t*>(put(nullptr, n * 4));
      p.unpack_dst = static_cast<int32_t*>(put(nullptr, n * 4));
      p.unpack_base = 512 * static_cast<int64_t>(ps.size()) + 3;
    }
    ps.push_back(p);
    row0s.push_back(total_rows);
    total_rows += c.rows;
    total_slots += c.rows * p.row_cap;
    id_base += c.n_old + c.rows + (p.selected ? (c.compact ? c.rows * c.top_k : c.entries) : 0);
  }
  std::vector<int32_t> const fill(static_cast<size_t>(total_slots), -9);
  auto* ids = static_cast<int32_t*>(put(fill.data(), fill.size() * 4));
  auto* cols = static_cast<int32_t*>(put(fill.data(), fill.size() * 4));
  auto* sinks = static_cast<int32_t*>(put(nullptr, static_cast<size_t>(total_rows) * 4));
  auto* begin = static_cast<int64_t*>(put(nullptr, static_cast<size_t>(total_rows) * 8));
  auto* end = static_cast<int64_t*>(put(nullptr, static_cast<size_t>(total_rows) * 8));
  for (size_t i = 0; i < ps.size(); ++i) {
    ps[i].key_ids = ids + ps[i].slot_base;
    ps[i].key_cols = cols + ps[i].slot_base;
    ps[i].sink_cols = sinks + row0s[i];
    ps[i].row_begin = begin + row0s[i];
    ps[i].row_end = end + row0s[i];
  }
  throw_if_error(gpu::build_key_lists_batched(mem, ps));
  std::vector<int32_t> h_ids(fill.size()), h_cols(fill.size()), h_sinks(static_cast<size_t>(total_rows));
  std::vector<int64_t> h_begin(static_cast<size_t>(total_rows)), h_end(static_cast<size_t>(total_rows));
  throw_if_error(mem.copy(h_ids.data(), ids, h_ids.size() * 4, Copy::kDevToHost));
  throw_if_error(mem.copy(h_cols.data(), cols, h_cols.size() * 4, Copy::kDevToHost));
  throw_if_error(mem.copy(h_sinks.data(), sinks, h_sinks.size() * 4, Copy::kDevToHost));
  throw_if_error(mem.copy(h_begin.data(), begin, h_begin.size() * 8, Copy::kDevToHost));
  throw_if_error(mem.copy(h_end.data(), end, h_end.size() * 8, Copy::kDevToHost));
  throw_if_error(mem.sync());
  int64_t bad = 0, untouched_ok = 0, unpack_checked = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    Case c = cases[i];
    bool const has_sel = !c.selected.empty();
    if (!has_sel) c.selected.assign(static_cast<size_t>(c.rows * c.top_k), -1), c.compact = false;
    Lists const want = plain(c);
    gpu::KeyListParams const& p = ps[i];
    std::vector<int32_t> gather;
    if (p.gather) {
      gather.resize(static_cast<size_t>(c.rows * c.top_k));
      throw_if_error(mem.copy(gather.data(), p.gather, gather.size() * 4, Copy::kDevToHost));
      throw_if_error(mem.sync());
      bad += gather != want.gather;
    }
    if (p.unpack_src) {  // compact: every slot (−1 for unused ones); else every entry, in order
      int64_t const n = p.gather ? c.rows * c.top_k : c.entries, part0 = p.id_base + c.n_old + c.rows;
      std::vector<int32_t> src(static_cast<size_t>(n)), dst(static_cast<size_t>(n));
      throw_if_error(mem.copy(src.data(), p.unpack_src, src.size() * 4, Copy::kDevToHost));
      throw_if_error(mem.copy(dst.data(), p.unpack_dst, dst.size() * 4, Copy::kDevToHost));
      throw_if_error(mem.sync());
      for (int64_t u = 0; u < n; ++u) {
        int64_t const e = p.gather ? want.gather[static_cast<size_t>(u)] : u;
        bad += src[static_cast<size_t>(u)] != (e < 0 ? -1 : p.unpack_base + e);
        bad += dst[static_cast<size_t>(u)] != part0 + u;
        ++unpack_checked;
      }
    }
    for (int64_t r = 0; r < c.rows; ++r) {
      int64_t const b = h_begin[static_cast<size_t>(row0s[i] + r)], e = h_end[static_cast<size_t>(row0s[i] + r)];
      int64_t const w0 = want.offsets[static_cast<size_t>(r)], w1 = want.offsets[static_cast<size_t>(r) + 1];
      bad += b != p.slot_base + r * p.row_cap || e - b != w1 - w0;
      for (int64_t k = 0; k < std::min(e - b, w1 - w0); ++k) {
        bad += h_ids[static_cast<size_t>(b + k)] != want.ids[static_cast<size_t>(w0 + k)] + p.id_base;
        bad += h_cols[static_cast<size_t>(b + k)] != want.cols[static_cast<size_t>(w0 + k)];
      }
      bad += h_sinks[static_cast<size_t>(row0s[i] + r)] != want.sinks[static_cast<size_t>(r)];
      if (e < b + p.row_cap) untouched_ok += h_ids[static_cast<size_t>(e)] == -9;  // past the list: not written
    }
  }
  BOOST_TEST(bad == 0);
  BOOST_TEST(untouched_ok > 0);
  BOOST_TEST(unpack_checked > 0);
  for (void* blk : blocks) mem.free(blk);
  mem.close();
}

BOOST_AUTO_TEST_SUITE_END()
