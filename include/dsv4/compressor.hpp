// dsv4/compressor.hpp — the KV compressors (SPEC §4–§6): C4 with overlap, C128, online C128, at
// attention width (584-byte FP8 entries) or indexer width (132 / 68-byte FP8 / FP4 keys).
//
// The API is batch-oriented and device-neutral: a state pool and a paged cache live on one device
// (CPU or CUDA); a ragged batch of requests brings new kv/score rows; `compress` completes every
// block it can, writes the entries into the cache and keeps what later steps need in the state.
// Every call validates everything on the host first and throws dsv4::Error naming the argument,
// leaving state and cache untouched. docs/compressor.md explains the state layout, rollback and fork.
//
//   CompressorSpec spec = CompressorSpec::for_layer(config, 2);
//   CompressorStatePool pool(spec, /*num_slots=*/64);
//   PagedCache cache = make_compressed_cache(spec, config.page_size, /*num_pages=*/1024);
//   int slot = pool.allocate();
//   compress(spec, {ape, norm}, {{slot, 0, T, page_table}}, kv, score, pool, cache);
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dsv4/cache_format.hpp"
#include "dsv4/config.hpp"
#include "dsv4/device.hpp"
#include "dsv4/paged_cache.hpp"
#include "dsv4/tensor.hpp"

namespace dsv4 {

// ---- what a compressor is ----------------------------------------------------------------------

struct CompressorSpec {
  int ratio = 0;            // m: tokens per compressed entry (≥ 1)
  int width = 0;            // c: values per entry (512 attention, d_I indexer)
  bool overlap = false;     // b/a branches over blocks n−1 and n (coff = 2); on when ratio == 4 in the models
  bool online = false;      // running (M, S, V) state instead of the block's rows; needs overlap off
  EntryKind output = EntryKind::Attention;  // cache entry produced
  RopeConfig rope;          // the layer's RoPE table; rope.rope_dim = r dims at the END of the entry
  double eps = 1e-6;        // RMSNorm eps
  std::int64_t max_positions = 0;  // a token position ≥ this is an error
  int max_rollback = 8;     // how many tokens below its highest count a request may roll back

  int coff() const { return overlap ? 2 : 1; }
  int row_width() const { return coff() * width; }  // channels of one kv or score row
  EntryLayout layout() const { return EntryLayout{output, width}; }

  // The compressor of layer `layer`: ratio, overlap and RoPE table from the layer; width head_dim
  // or, for the indexer's own compressor, index_head_dim with `indexer_format`; eps and max
  // positions from the model. Throws Error("layer") for a layer out of range or of ratio 0, and
  // Error("online") for an online request on an overlapping layer.
  static CompressorSpec for_layer(const ModelConfig& model, int layer, bool indexer = false,
                                  IndexerKeyFormat indexer_format = IndexerKeyFormat::FP8, bool online = false);
};

// Throws Error naming the field at fault ("ratio", "width", "online", "rope", ...).
void validate_compressor_spec(const CompressorSpec& spec);

// Learned parameters; views on the device of the pool and cache.
struct CompressorWeights {
  TensorView ape;   // [m, coff·c] F32: added to the score of token p as ape[p mod m]
  TensorView norm;  // [c] F32: RMSNorm weight
};

// Float32 rows [rows, cols] with their own row stride (in floats), so a fused [kv | score]
// projection output [T, 2·coff·c] can be passed as two column ranges without a copy.
struct MatrixF32View {
  const float* data = nullptr;   // [rows, row_stride], columns [0, cols) used
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t row_stride = 0;   // ≥ cols
  Device device = Device::CPU;

  // A contiguous 2-D F32 tensor. Throws Error(name) for another dtype or rank.
  static MatrixF32View of(const TensorView& tensor, const std::string& name);
  // Columns [begin, begin + count) of this view (same rows and stride). Error("columns") when out of range.
  MatrixF32View columns(std::int64_t begin, std::int64_t count) const;
};

// ---- per-request streaming state ---------------------------------------------------------------

// Per request slot, what continuing the stream needs (SPEC §6), on one device:
//   two-pass: a ring of R = coff·m + max_rollback rows, row p in slot p mod R, each row
//             [ kv (coff·c) | score + ape (coff·c) ] float32;
//   online:   a ring of max_rollback + 1 snapshots, the state after L tokens in slot L mod
//             (max_rollback + 1), each [ M (c) | S (c) | V (c) ] float32 of the open block.
// Slot 0 is the null slot: never allocated; a batch may name it only as padding with no tokens.
// The host keeps per slot the token count and the lowest count a rollback may reach.
class CompressorStatePool {
 public:
  CompressorStatePool() = default;
  // Throws Error("spec"/field) for an invalid spec and Error("num_slots") when num_slots < 2.
  CompressorStatePool(const CompressorSpec& spec, int num_slots, Device device = Device::CPU);

  const CompressorSpec& spec() const { return spec_; }
  int num_slots() const { return static_cast<int>(tokens_.size()); }  // including the null slot 0
  Device device() const { return storage_.device(); }
  // Rows (two-pass) or snapshots (online) kept per slot.
  int records_per_slot() const { return records_per_slot_; }
  // Floats per row (2·coff·c) or per snapshot (3·c).
  int record_floats() const { return record_floats_; }
  // The state [num_slots, records_per_slot, record_floats] F32 on device().
  const Tensor& storage() const { return storage_; }

  // A free slot with no tokens. Throws Error("pool") when every slot is in use.
  int allocate();
  // Returns a slot to the free list. Error("slot") unless it is allocated.
  void release(int slot);
  bool in_use(int slot) const;
  // Tokens the slot has seen (its next token's position).
  std::int64_t tokens(int slot) const;
  // The lowest token count rollback() may return this slot to.
  std::int64_t rollback_floor(int slot) const;
  // Error(argument) unless 1 ≤ slot < num_slots() and the slot is allocated.
  void check_allocated(int slot, const std::string& argument = "slot") const;

 private:
  friend struct CompressorStateAccess;  // the compress / rollback / fork operations (src/)
  CompressorSpec spec_;
  int records_per_slot_ = 0;
  int record_floats_ = 0;
  Tensor storage_;
  std::vector<std::int64_t> tokens_;          // [num_slots]
  std::vector<std::int64_t> rollback_floor_;  // [num_slots]
  std::vector<bool> allocated_;               // [num_slots]
  // CUDA two-pass long windows without overlap: per slot the running statistics of the open block's
  // complete slices (runtime/slice_chains.hpp), and whether they hold exactly those.
  Tensor chains_;                             // [num_slots, chain floats] F32, or empty
  std::vector<bool> chains_complete_;         // [num_slots]
};

// A zero-filled compressed cache for `spec` with page size `page_size` raw tokens
// (entries_per_page = page_size / m). Error("page_size") unless m divides it.
PagedCache make_compressed_cache(const CompressorSpec& spec, int page_size, int num_pages,
                                 Device device = Device::CPU);

// ---- one ragged step ---------------------------------------------------------------------------

struct CompressRequest {
  int slot = 0;                  // state slot (≥ 1); 0 only as padding with no tokens
  std::int64_t prefix_len = 0;   // tokens processed before this step; must equal pool.tokens(slot)
  std::int64_t new_tokens = 0;   // rows this request brings (any number ≥ 0)
  std::span<const std::int32_t> page_table;  // host: logical page → physical page; pages of the
                                             // entries this step completes must be valid (≥ 1)
};
// Requests of one step; their new rows are concatenated in this order in kv and score.
using CompressBatch = std::vector<CompressRequest>;

// Optional outputs, one row per compress event (events ordered by request, then entry number).
// Leave a view default (null data, empty shape) to skip it; given views must be exactly
// [num_events, ...] on the pool's device.
struct CompressOutputs {
  TensorView compressed;   // [E, c] F32: C_n before post-processing (SPEC §4)
  TensorView entry_ids;    // [E] I32: entry number n within its request
  TensorView positions;    // [E] I32: RoPE position n·m of the entry
  TensorView cache_slots;  // [E] I32: physical cache slot written
};

// The host-side plan of one step, shared by every backend: which rows belong to which request and
// which entries (compress events) the step completes.
struct PlannedRequest {
  int slot = 0;
  std::int64_t prefix_len = 0;
  std::int64_t new_tokens = 0;
  std::int64_t row_begin = 0;    // first row of this request in kv / score
  std::int64_t first_event = 0;  // index of its first event in CompressPlan::events
  std::int64_t num_events = 0;   // floor((prefix+new)/m) − floor(prefix/m)
  bool chains_complete = false;  // the slot's slice chains hold its open block's complete slices (CUDA C128)
};
struct PlannedEvent {
  int request = 0;               // index into CompressPlan::requests
  std::int64_t entry = 0;        // n: the block [n·m, n·m + m) it completes
  std::int32_t cache_slot = 0;   // physical slot of entry n through the request's page table
};
struct CompressPlan {
  std::int64_t total_rows = 0;   // T: rows of kv and score
  std::vector<PlannedRequest> requests;
  std::vector<PlannedEvent> events;
};

// Number of compress events of `batch` (rows of the optional outputs). Does not validate.
std::int64_t count_compress_events(const CompressorSpec& spec, const CompressBatch& batch);

// Validates one step completely and returns its plan; changes nothing. Checks the spec, weight
// shapes/dtypes/devices, that pool and cache were made for this spec, every request (slot
// allocated and not repeated, prefix = the slot's token count, positions < max_positions, page
// table entries of written pages in [1, num_pages), no physical page written by two requests),
// kv/score [T, coff·c] with T = Σ new_tokens, and the optional outputs — each sharing no byte with
// another, the weights, the pool's state, the cache or the whole span of the kv and score rows (the
// gaps of a strided view included).
CompressPlan plan_compress(const CompressorSpec& spec, const CompressorWeights& weights, const CompressBatch& batch,
                           const MatrixF32View& kv, const MatrixF32View& score, const CompressorStatePool& pool,
                           const PagedCache& cache, const CompressOutputs& outputs = {});

// One step on the device of the pool and cache: for every request, appends its rows
// kv [T, coff·c] and score [T, coff·c] (score WITHOUT ape) to its stream; every block completed is
// compressed (SPEC §4), post-processed, encoded and stored into `cache` at its physical slot; the
// state keeps what later steps and rollbacks need. Chunk- and batch-invariant: the bytes never
// depend on how a request's tokens were split into steps or which requests share a step.
// Errors as plan_compress, plus Error("device") for a backend not built; on error nothing changes.
// CUDA: the work is queued on `stream` (a cudaStream_t; nullptr: the default stream) and the call
// returns without waiting; the host-side token counts advance at once. The CPU ignores `stream`.
// The step's kernels allow early launches (programmatic dependent launch) at their start: a kernel
// launched after them with programmatic stream serialization may take free SMs while they run and
// must execute griddepcontrol.wait before it reads their outputs, the pool or the cache, or writes
// any of their inputs. (They launch early themselves, waiting for the kernel before them before
// touching any tensor, but through this call the step's metadata upload comes first.)
void compress(const CompressorSpec& spec, const CompressorWeights& weights, const CompressBatch& batch,
              const MatrixF32View& kv, const MatrixF32View& score, CompressorStatePool& pool, PagedCache& cache,
              const CompressOutputs& outputs = {}, void* stream = nullptr);

// Speculative decoding: drops the last `n` tokens of `slot`, so state and cache are as if they
// never arrived (every continuation gives the same bytes). Entries those tokens completed are
// zeroed in the cache through `page_table`. Allowed while tokens − n ≥ rollback_floor(slot),
// i.e. at most spec.max_rollback below the highest count the slot reached (and never below a
// fork point). Errors: Error("n"), Error("slot"), Error("page_table"); nothing changes on error.
// CUDA: the cache clears are queued on `stream` (nullptr: the default stream), as for compress.
void rollback(CompressorStatePool& pool, int slot, std::int64_t n, PagedCache& cache,
              std::span<const std::int32_t> page_table, void* stream = nullptr);

// Prefix reuse: `dst_slot` (allocated, no tokens) continues from `src_slot`'s state after its first
// `prefix_tokens` tokens. The caller shares the src request's cache pages for those tokens (the
// first prefix_tokens / page_size logical pages of its page table) and gives dst fresh pages after.
// prefix_tokens must be a page boundary (a multiple of m·entries_per_page of `cache`): a fork
// mid-block is refused with Error("prefix_tokens"), as is one mid-page or one the src state no
// longer holds (below rollback_floor(src_slot), or above its token count). dst cannot roll back
// past the fork point. CUDA: the state copy is queued on `stream` (nullptr: the default stream).
void fork_prefix(CompressorStatePool& pool, int src_slot, int dst_slot, std::int64_t prefix_tokens,
                 const PagedCache& cache, void* stream = nullptr);

// ---- a single request, for the CLI and tests ---------------------------------------------------

// One request with its own pool (one slot), cache (pages 1, 2, ... in logical order) and weights.
class SingleRequestCompressor {
 public:
  // Copies `ape` [m, coff·c] and `norm` [c] (F32, host) to `device`; room for `capacity_tokens`.
  SingleRequestCompressor(const CompressorSpec& spec, const TensorView& ape, const TensorView& norm,
                          std::int64_t capacity_tokens, int page_size, Device device = Device::CPU);

  struct Appended {
    Tensor compressed;                   // [n, c] F32 on the host: C before post-processing
    std::vector<std::int64_t> entry_ids; // [n] entry numbers
    std::vector<std::int64_t> positions; // [n] RoPE positions n·m
  };
  // Appends rows kv, score [t, coff·c] (F32, host; score without ape), t ≥ 0, and returns the
  // entries they completed. Error("kv") when the capacity would be exceeded.
  Appended append(const TensorView& kv, const TensorView& score);
  void rollback(std::int64_t n);  // as dsv4::rollback

  const CompressorSpec& spec() const { return spec_; }
  std::int64_t tokens() const { return pool_.tokens(slot_); }
  std::int64_t num_entries() const { return tokens() / spec_.ratio; }
  const PagedCache& cache() const { return cache_; }
  const CompressorStatePool& pool() const { return pool_; }
  int slot() const { return slot_; }
  const std::vector<std::int32_t>& page_table() const { return page_table_; }
  std::int64_t cache_slot(std::int64_t entry) const;          // physical slot of entry n
  std::vector<std::uint8_t> entry_bytes(std::int64_t entry) const;  // gathered (EntryLayout::gather)
  std::vector<float> decoded_entry(std::int64_t entry) const;       // [c]

 private:
  CompressorSpec spec_;
  Tensor ape_, norm_;
  CompressorStatePool pool_;
  PagedCache cache_;
  std::vector<std::int32_t> page_table_;
  std::int64_t capacity_tokens_ = 0;
  int slot_ = 0;
};

}  // namespace dsv4
