// SPDX-License-Identifier: Apache-2.0
/// Backend memory of the GPU model (gpu_internal.hpp): Mem (cudaMalloc / stream-ordered copies, or host
/// memory), the size-class DevicePool and DevBlock, and the glue operations on either backend: the CUDA
/// launch, or a host twin computing the same values (embedding broadcast, rn(x·s), the CSR key lists
/// in the same order as the kernel and as the CPU model's attention block, and row copies).
#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "models/deepseek_v41/gpu_internal.hpp"
#include "tessera/models/deepseek_v41/gpu_model.hpp"

#if TESSERA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace tessera::model::dsv41 {

namespace gpu {

#if TESSERA_WITH_CUDA
namespace {
Status cuda_ok(cudaError_t e, char const* what) {
  if (e == cudaSuccess) return {};
  return Status(e == cudaErrorMemoryAllocation ? StatusCode::kOutOfMemory : StatusCode::kCudaError,
                std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace
#endif

Result<void*> Mem::alloc(size_t bytes) const {
  if (backend == Backend::kCpu) {
    void* p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) & ~size_t{255});
    if (!p) return Status(StatusCode::kOutOfMemory, "host allocation of " + std::to_string(bytes) + " bytes");
    return p;
  }
#if TESSERA_WITH_CUDA
  void* p = nullptr;
  TESSERA_TRY(cuda_ok(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc"));
  return p;
#else
  return not_supported("Tessera was built without CUDA");
#endif
}

void Mem::free(void* p) const {
  if (backend == Backend::kCpu) {
    std::free(p);
    return;
  }
#if TESSERA_WITH_CUDA
  cudaFree(p);
#endif
}

Status Mem::copy(void* dst, void const* src, size_t bytes, Copy kind) const {
  if (bytes == 0) return {};
  if (backend == Backend::kCpu) {
    std::memcpy(dst, src, bytes);
    return {};
  }
#if TESSERA_WITH_CUDA
  if (stage) {  // recording a graph: the copy runs when the graph does
    if (kind == Copy::kDevToHost)
      return Status(StatusCode::kInternal, "a device-to-host copy inside a recorded graph segment");
    if (kind == Copy::kHostToDev) {
      auto staged = stage->put(src, bytes);
      if (!staged) return staged.status();
      src = *staged;
    }
  }
  cudaMemcpyKind k = kind == Copy::kHostToDev ? cudaMemcpyHostToDevice
                     : kind == Copy::kDevToHost ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
  return cuda_ok(cudaMemcpyAsync(dst, src, bytes, k, reinterpret_cast<cudaStream_t>(stream)), "cudaMemcpyAsync");
#else
  (void)kind;
  return not_supported("Tessera was built without CUDA");
#endif
}

Status Mem::sync() const {
  if (backend == Backend::kCpu) return {};
#if TESSERA_WITH_CUDA
  if (stage) return Status(StatusCode::kInternal, "a stream synchronisation inside a recorded graph segment");
  return cuda_ok(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
#else
  return {};
#endif
}

Status Mem::open(DeviceInfo* info) {
  if (backend == Backend::kCpu) return {};
#if TESSERA_WITH_CUDA
  cudaStream_t s = nullptr;
  TESSERA_TRY(cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
  stream = reinterpret_cast<CUstream_st*>(s);
  int dev = 0;
  cudaDeviceProp prop{};
  TESSERA_TRY(cuda_ok(cudaGetDevice(&dev), "cudaGetDevice"));
  TESSERA_TRY(cuda_ok(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties"));
  info->sm = prop.major * 10 + prop.minor;
  info->num_sms = prop.multiProcessorCount;
  info->smem_per_block_optin = prop.sharedMemPerBlockOptin;
  info->global_memory = prop.totalGlobalMem;
  info->name = prop.name;
  return {};
#else
  (void)info;
  return not_supported("--device cuda: Tessera was built without CUDA");
#endif
}

void Mem::close() {
#if TESSERA_WITH_CUDA
  if (backend == Backend::kCuda && stream) {
    cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream));
    cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream));
  }
#endif
  stream = nullptr;
}

HostStage::~HostStage() {
#if TESSERA_WITH_CUDA
  for (Chunk const& c : chunks_) cudaFreeHost(c.p);
#endif
}

Result<void const*> HostStage::put(void const* src, size_t bytes) {
#if TESSERA_WITH_CUDA
  size_t const need = (bytes + 15) & ~size_t{15};
  while (cur_ < chunks_.size() && chunks_[cur_].used + need > chunks_[cur_].cap) ++cur_;
  if (cur_ == chunks_.size()) {
    size_t const cap = std::max<size_t>(need, size_t{1} << 20);
    void* p = nullptr;
    TESSERA_TRY(cuda_ok(cudaHostAlloc(&p, cap, cudaHostAllocDefault), "cudaHostAlloc (graph upload stage)"));
    chunks_.push_back({static_cast<unsigned char*>(p), cap, 0});
  }
  Chunk& c = chunks_[cur_];
  unsigned char* dst = c.p + c.used;
  std::memcpy(dst, src, bytes);
  c.used += need;
  return static_cast<void const*>(dst);
#else
  (void)src, (void)bytes;
  return not_supported("Tessera was built without CUDA");
#endif
}

void HostStage::reset() {
  for (Chunk& c : chunks_) c.used = 0;
  cur_ = 0;
}

size_t HostStage::capacity() const {
  size_t n = 0;
  for (Chunk const& c : chunks_) n += c.cap;
  return n;
}

GraphCapture::~GraphCapture() {
#if TESSERA_WITH_CUDA
  for (auto const& seg : exec_)
    for (Exec const& e : seg) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e.exec));
#endif
}

#if TESSERA_WITH_CUDA
namespace {
/// FNV-1a over the recording's nodes in creation order: each node's kind and, for kernels, the function.
Result<uint64_t> graph_shape(cudaGraph_t g) {
  size_t n = 0;
  TESSERA_TRY(cuda_ok(cudaGraphGetNodes(g, nullptr, &n), "cudaGraphGetNodes"));
  std::vector<cudaGraphNode_t> nodes(n);
  TESSERA_TRY(cuda_ok(cudaGraphGetNodes(g, nodes.data(), &n), "cudaGraphGetNodes"));
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  mix(n);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    TESSERA_TRY(cuda_ok(cudaGraphNodeGetType(node, &t), "cudaGraphNodeGetType"));
    mix(static_cast<uint64_t>(t));
    if (t == cudaGraphNodeTypeKernel) {
      cudaKernelNodeParams kp{};
      TESSERA_TRY(cuda_ok(cudaGraphKernelNodeGetParams(node, &kp), "cudaGraphKernelNodeGetParams"));
      mix(reinterpret_cast<uintptr_t>(kp.func));
    }
  }
  return h;
}
}  // namespace
#endif

Status GraphCapture::begin(Mem& mem) {
  if (mem.backend != Backend::kCuda) return not_supported("CUDA graphs need the CUDA backend");
  if (recording_) return Status(StatusCode::kInternal, "GraphCapture::begin: already recording");
#if TESSERA_WITH_CUDA
  // Relaxed: the host work between launches (pool blocks from cudaMalloc, pinned stage chunks) stays legal.
  TESSERA_TRY(cuda_ok(cudaStreamBeginCapture(reinterpret_cast<cudaStream_t>(mem.stream), cudaStreamCaptureModeRelaxed),
                      "cudaStreamBeginCapture"));
  recording_ = true;
  mem.stage = &stage_;
  return {};
#else
  return not_supported("Tessera was built without CUDA");
#endif
}

Status GraphCapture::end_and_launch(Mem& mem, size_t segment) {
  if (!recording_) return Status(StatusCode::kInternal, "GraphCapture::end_and_launch: not recording");
#if TESSERA_WITH_CUDA
  auto const stream = reinterpret_cast<cudaStream_t>(mem.stream);
  recording_ = false;
  mem.stage = nullptr;
  cudaGraph_t graph = nullptr;
  TESSERA_TRY(cuda_ok(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture"));
  struct GraphGuard {
    cudaGraph_t g;
    ~GraphGuard() { if (g) cudaGraphDestroy(g); }
  } guard{graph};
  auto const shape = graph_shape(graph);
  if (!shape) return shape.status();
  if (exec_.size() <= segment) exec_.resize(segment + 1);
  std::vector<Exec>& cached = exec_[segment];
  auto it = std::find_if(cached.begin(), cached.end(), [&](Exec const& e) { return e.shape == *shape; });
  if (it != cached.end()) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(static_cast<cudaGraphExec_t>(it->exec), graph, &info) == cudaSuccess) {
      ++counts_.updates;
    } else {  // same kinds and kernels, parameters an update cannot take: a new executable below
      cudaGetLastError();
      cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(it->exec));
      cached.erase(it);
      it = cached.end();
    }
  }
  if (it == cached.end()) {
    if (cached.size() == kShapesPerSegment) {  // the least recently used shape goes
      auto lru = std::min_element(cached.begin(), cached.end(),
                                  [](Exec const& a, Exec const& b) { return a.last_use < b.last_use; });
      cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(lru->exec));
      cached.erase(lru);
    }
    cudaGraphExec_t exec = nullptr;
    TESSERA_TRY(cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate"));
    cached.push_back({*shape, exec, 0});
    it = cached.end() - 1;
    ++counts_.instantiations;
  }
  it->last_use = ++clock_;
  TESSERA_TRY(cuda_ok(cudaGraphLaunch(static_cast<cudaGraphExec_t>(it->exec), stream), "cudaGraphLaunch"));
  ++counts_.launches;
  return {};
#else
  return not_supported("Tessera was built without CUDA");
#endif
}

void GraphCapture::abort(Mem& mem) {
  if (!recording_) return;
  recording_ = false;
  mem.stage = nullptr;
#if TESSERA_WITH_CUDA
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(reinterpret_cast<cudaStream_t>(mem.stream), &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
#endif
}

DevicePool::~DevicePool() {
  for (void* p : all_) mem_.free(p);
}

Result<void*> DevicePool::get(size_t bytes, size_t* capacity) {
  size_t const cls = std::max<size_t>(4096, std::bit_ceil(std::max<size_t>(bytes, 1)));
  std::lock_guard lk(mu_);
  auto& fl = free_[cls];
  *capacity = cls;
  if (!fl.empty()) {
    void* p = fl.back();
    fl.pop_back();
    return p;
  }
  auto p = mem_.alloc(cls);
  if (!p) return p.status();
  all_.push_back(*p);
  held_ += cls;
  return *p;
}

void DevicePool::put(void* p, size_t capacity) {
  std::lock_guard lk(mu_);
  free_[capacity].push_back(p);
}

DevBlock& DevBlock::operator=(DevBlock&& o) noexcept {
  if (this != &o) {
    reset();
    pool_ = o.pool_;
    p_ = o.p_;
    cap_ = o.cap_;
    o.pool_ = nullptr;
    o.p_ = nullptr;
    o.cap_ = 0;
  }
  return *this;
}

Result<DevBlock> DevBlock::make(DevicePool& pool, size_t bytes) {
  DevBlock b;
  auto p = pool.get(bytes, &b.cap_);
  if (!p) return p.status();
  b.pool_ = &pool;
  b.p_ = *p;
  return b;
}

void DevBlock::reset() {
  if (p_ && pool_) pool_->put(p_, cap_);
  pool_ = nullptr;
  p_ = nullptr;
  cap_ = 0;
}

using Copy = Mem::Copy;

void PagedRows::configure(int64_t row_bytes, int64_t page_bytes) {
  row_bytes_ = row_bytes;
  per_page_ = rows_per_page_for(row_bytes, page_bytes);
  page_bytes_ = per_page_ * row_bytes;
}

Status PagedRows::reserve(DevicePool& pool, Mem const& mem, int64_t rows) {
  if (!configured()) return Status(StatusCode::kInternal, "paged rows: reserve before configure");
  size_t const need = static_cast<size_t>((rows + per_page_ - 1) / per_page_);
  size_t const have = pages_.size();
  if (need <= have) return {};
  for (size_t i = have; i < need; ++i) {
    auto b = DevBlock::make(pool, static_cast<size_t>(page_bytes_));
    if (!b) return b.status();
    addresses_.push_back(static_cast<uint8_t const*>(b->get()));
    pages_.push_back(std::move(*b));
  }
  size_t const bytes = need * sizeof(void*);
  if (table_ && table_.capacity() >= bytes)  // the new addresses only
    return mem.copy(table_.as<uint8_t const*>() + have, addresses_.data() + have, (need - have) * sizeof(void*),
                    Copy::kHostToDev);
  auto t = DevBlock::make(pool, std::max(bytes, table_.capacity() * 2));
  if (!t) return t.status();
  table_ = std::move(*t);
  return mem.copy(table_.get(), addresses_.data(), bytes, Copy::kHostToDev);
}

Status PagedRows::write(Mem const& mem, int64_t row0, int64_t n, void const* src) const {
  auto const* from = static_cast<uint8_t const*>(src);
  while (n > 0) {
    size_t const page = static_cast<size_t>(row0 / per_page_);
    if (page >= pages_.size()) return Status(StatusCode::kInternal, "paged rows: write beyond the reserved rows");
    int64_t const in_page = row0 % per_page_, k = std::min(n, per_page_ - in_page);
    TESSERA_TRY(mem.copy(pages_[page].as<uint8_t>() + in_page * row_bytes_, from, static_cast<size_t>(k * row_bytes_),
                         Copy::kDevToDev));
    from += k * row_bytes_;
    row0 += k;
    n -= k;
  }
  return {};
}

Status PagedRows::read(Mem const& mem, int64_t n, void* dst) const {
  auto* to = static_cast<uint8_t*>(dst);
  for (int64_t row0 = 0; row0 < n; row0 += per_page_) {
    size_t const page = static_cast<size_t>(row0 / per_page_);
    if (page >= pages_.size()) return Status(StatusCode::kInternal, "paged rows: read beyond the reserved rows");
    int64_t const k = std::min(n - row0, per_page_);
    TESSERA_TRY(mem.copy(to + row0 * row_bytes_, pages_[page].get(), static_cast<size_t>(k * row_bytes_), Copy::kDevToDev));
  }
  return {};
}

void PagedRows::shrink(int64_t rows) {
  size_t const keep = static_cast<size_t>((std::max<int64_t>(rows, 0) + per_page_ - 1) / std::max<int64_t>(per_page_, 1));
  if (keep >= pages_.size()) return;
  pages_.resize(keep);  // the table's stale tail is never read: rows ≥ rows are not listed
  addresses_.resize(keep);
}

Status PagedRows::assign(DevicePool& pool, Mem const& mem, PagedRows const& o, int64_t rows) {
  pages_.clear();
  addresses_.clear();
  table_.reset();
  row_bytes_ = o.row_bytes_;
  per_page_ = o.per_page_;
  page_bytes_ = o.page_bytes_;
  if (!configured() || rows == 0) return {};
  TESSERA_TRY(reserve(pool, mem, rows));
  for (size_t i = 0; i < pages_.size(); ++i)
    TESSERA_TRY(mem.copy(pages_[i].get(), o.pages_[i].get(), static_cast<size_t>(page_bytes_), Copy::kDevToDev));
  return {};
}

size_t PagedRows::bytes() const {
  size_t b = table_.capacity();
  for (auto const& p : pages_) b += p.capacity();
  return b;
}

Status embed_streams(Mem const& m, float const* emb, int32_t const* tokens, int64_t rows, int64_t n, int64_t D, float* X,
                     float* pre) {
  if (m.backend == Backend::kCuda) {
#if TESSERA_WITH_CUDA
    return launch_embed_streams(m.stream, emb, tokens, rows, n, D, X, pre);
#else
    return not_supported("Tessera was built without CUDA");
#endif
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < n; ++k) std::memcpy(X + (r * n + k) * D, emb + tokens[r] * D, static_cast<size_t>(D) * 4);
    for (int64_t k = 0; k < n; ++k) pre[r * n + k] = k == 0 ? 1.f : 0.f;
  }
  return {};
}

Status scale_inplace(Mem const& m, float* x, int64_t count, float s) {
  if (m.backend == Backend::kCuda) {
#if TESSERA_WITH_CUDA
    return launch_scale_inplace(m.stream, x, count, s);
#else
    return not_supported("Tessera was built without CUDA");
#endif
  }
  for (int64_t i = 0; i < count; ++i) x[i] = x[i] * s;
  return {};
}

namespace {
/// Row r's list (pool ids + id_base) at out, its key columns at cols (bf16: p.key_cols set) and, compact pools, its
/// gather slots: the host twin of key_fill / key_cols. Returns the list's length.
int64_t host_list_row(KeyListParams const& p, int64_t r, int32_t* out, int32_t* cols) {
  int64_t i0, j0;
  key_list_ranges(p, r, i0, j0);
  int64_t k = 0;
  for (int64_t i = i0; i < p.n_old; ++i) out[k++] = static_cast<int32_t>(i);
  for (int64_t j = j0; j <= r; ++j) out[k++] = static_cast<int32_t>(p.n_old + j);
  if (p.selected) {
    std::vector<int32_t> sel;
    for (int64_t i = 0; i < p.top_k; ++i) {
      int32_t const e = p.selected[r * p.top_k + i];
      if (e >= 0 && e < p.entries) sel.push_back(e);
    }
    std::sort(sel.begin(), sel.end());
    if (p.gather) {
      int32_t* g = p.gather + r * p.top_k;
      std::fill(g, g + p.top_k, -1);
      for (size_t i = 0; i < sel.size(); ++i) {
        g[i] = sel[i];
        out[k++] = static_cast<int32_t>(p.n_old + p.rows + r * p.top_k + static_cast<int64_t>(i));
      }
      if (p.unpack_src)
        for (int64_t i = 0; i < p.top_k; ++i) {
          int64_t const u = r * p.top_k + i;
          p.unpack_src[u] = g[i] < 0 ? -1 : static_cast<int32_t>(p.unpack_base + g[i]);
          p.unpack_dst[u] = static_cast<int32_t>(p.id_base + p.n_old + p.rows + u);
        }
    } else {
      for (int32_t e : sel) out[k++] = static_cast<int32_t>(p.n_old + p.rows + e);
    }
  }
  if (p.key_cols) {
    for (int64_t i = 0; i < k; ++i) cols[i] = key_column(p, r, out[i]);
    p.sink_cols[r] = sink_column(p, r);
  }
  for (int64_t i = 0; i < k; ++i) out[i] = static_cast<int32_t>(out[i] + p.id_base);
  return k;
}
}  // namespace

Status build_key_lists(Mem const& m, KeyListParams const& p) {
  if (p.unpack_src) return Status(StatusCode::kInternal, "build_key_lists: unpack lists are build_key_lists_batched's");
  if (m.backend == Backend::kCuda) {
#if TESSERA_WITH_CUDA
    return launch_build_key_lists(m.stream, p);
#else
    return not_supported("Tessera was built without CUDA");
#endif
  }
  int64_t acc = 0;
  p.offsets[0] = 0;
  for (int64_t r = 0; r < p.rows; ++r) {
    int64_t const k = host_list_row(p, r, p.key_ids + acc, p.key_cols ? p.key_cols + acc : nullptr);
    if (p.row_begin) p.row_begin[r] = p.slot_base + acc;
    acc += k;
    p.offsets[r + 1] = acc;
    if (p.row_end) p.row_end[r] = p.slot_base + acc;
  }
  return {};
}

Status build_key_lists_batched(Mem const& m, std::span<KeyListParams const> seqs) {
  for (KeyListParams const& p : seqs) {
    if (p.row_cap < p.window + (p.selected ? p.top_k : 0) || !p.row_begin || !p.row_end)
      return Status(StatusCode::kInternal, "build_key_lists_batched: row_cap < window + top_k, or no row_begin / row_end");
    int64_t const last = p.id_base + p.n_old + p.rows + (p.gather ? p.rows * p.top_k : p.entries);
    if (p.unpack_src && (!p.unpack_dst || p.unpack_base + p.entries > INT32_MAX || last > INT32_MAX))
      return Status(StatusCode::kInternal, "build_key_lists_batched: unpack list without targets, or past int32 ids");
  }
  if (m.backend == Backend::kCuda) {
#if TESSERA_WITH_CUDA
    for (size_t i = 0; i < seqs.size(); i += kKeyListBatch)
      TESSERA_TRY(launch_build_key_lists_batched(m.stream, seqs.data() + i,
                                                 static_cast<int>(std::min<size_t>(kKeyListBatch, seqs.size() - i))));
    return {};
#else
    return not_supported("Tessera was built without CUDA");
#endif
  }
  for (KeyListParams const& p : seqs) {
    for (int64_t r = 0; r < p.rows; ++r) {
      int64_t const k = host_list_row(p, r, p.key_ids + r * p.row_cap, p.key_cols ? p.key_cols + r * p.row_cap : nullptr);
      p.row_begin[r] = p.slot_base + r * p.row_cap;
      p.row_end[r] = p.row_begin[r] + k;
    }
    if (p.unpack_src && !p.gather && p.rows > 0)
      for (int64_t e = 0; e < p.entries; ++e) {
        p.unpack_src[e] = static_cast<int32_t>(p.unpack_base + e);
        p.unpack_dst[e] = static_cast<int32_t>(p.id_base + p.n_old + p.rows + e);
      }
  }
  return {};
}

Status window_gather(Mem const& m, std::span<WindowGather const> seqs, int64_t cols) {
  for (WindowGather const& g : seqs)
    if (g.n_old > 0 && (g.cap < g.n_old || !g.ring))
      return Status(StatusCode::kInternal, "window_gather: a ring shorter than its rows");
  if (m.backend == Backend::kCuda) {
#if TESSERA_WITH_CUDA
    for (size_t i = 0; i < seqs.size(); i += kWindowGatherBatch)
      TESSERA_TRY(launch_window_gather(m.stream, seqs.data() + i,
                                       static_cast<int>(std::min<size_t>(kWindowGatherBatch, seqs.size() - i)), cols));
    return {};
#else
    return not_supported("Tessera was built without CUDA");
#endif
  }
  for (WindowGather const& g : seqs) {
    for (int64_t j = 0; j < g.n_old; ++j)
      std::memcpy(g.dst + j * cols, g.ring + ((g.p0 + j) % g.cap) * cols, static_cast<size_t>(cols) * 4);
    if (g.chunk_rows > 0)
      std::memcpy(g.dst + g.n_old * cols, g.chunk, static_cast<size_t>(g.chunk_rows * cols) * 4);
  }
  return {};
}

Status copy_rows(Mem const& m, RowCopy const* table, int64_t count, int64_t cols) {
  if (m.backend == Backend::kCuda) {
#if TESSERA_WITH_CUDA
    return launch_copy_rows(m.stream, table, count, cols);
#else
    return not_supported("Tessera was built without CUDA");
#endif
  }
  for (int64_t i = 0; i < count; ++i) std::memcpy(table[i].dst, table[i].src, static_cast<size_t>(cols) * 4);
  return {};
}

}  // namespace gpu

bool cuda_model_available() {
#if TESSERA_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
#else
  return false;
#endif
}

}  // namespace tessera::model::dsv41
