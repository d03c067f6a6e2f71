// src/cuda/sparse_attention/timeline.cuh — optional per-block timeline of the wgmma kernel (debug builds only).
//
// Compiled in only with -DDSV4_ATTENTION_TIMELINE (off by default: then DSV4_TIMELINE(...) expands to
// nothing and the kernel's SASS is byte-identical to a build without this header). When on, and a
// buffer was set with set_timeline_buffer, the leader thread of each warpgroup (threadIdx.x % 128 == 0)
// writes %clock64 stamps of its phases into one record per thread block; thread 0 also writes the
// CTA's %globaltimer and SM at start, each consumer %globaltimer at its end (to place CTAs across SMs).
// One stamp is one clock read and one 8-byte store by one lane, so the perturbation is small.
// bench_sparse_attention --timeline reads the records back (bench/sparse_attention_timeline.hpp).
#pragma once

#ifdef DSV4_ATTENTION_TIMELINE

#include <cstddef>
#include <cstdint>

#include "cuda/sparse_attention/config.cuh"

namespace dsv4::cuda::sparse_attention::timeline {

// One record per thread block: kHeaderWords, then kWordsPerBlock per live 64-candidate block (index
// `it` of the chunk's live blocks, ≤ kMaxBlocksPerSplit). Every word is a %clock64 value of the
// block's SM unless named otherwise; words never written stay as the host left them (zero).
enum HeaderWord : int {
  kStartGlobal = 0,         // %globaltimer (ns) at kernel entry (thread 0)
  kStartClock = 1,          // %clock64 at kernel entry (thread 0)
  kPlanDone = 2,            // slot plan built (plan_chunk returned; thread 0)
  kReady = 3,               // Q in shared memory and plan visible to all (the __syncthreads; thread 0)
  kSmAndLive = 4,           // %smid | live blocks << 32
  kProducerEnd = 5,         // the producer's last tile handed over
  kEpilogueStart = 6,       // + consumer (0, 1): after the last P·V
  kEnd = 8,                 // + consumer: before the consumer returns (output, partials or merge written)
  kEndGlobal = 10,          // + consumer: %globaltimer (ns) at kEnd
  // The cluster merge's steps (consumer 0's leader; merge_in_cluster):
  kMergeValuesPlaced = 12,  // every chunk's values staged (the first cluster barrier passed)
  kMergeWeightsDone = 13,   // the statistics gathered, the weights and 1/denominators in shared memory
  kMergeStored = 14,        // the merged outputs stored
  kMergeReleased = 15,      // the last cluster barrier passed
  kHeaderWords = 16,
};
enum ProducerWord : int {
  kLoadsIssued = 0,  // the previous tile handed over, the L2 prefetch two ahead and the loads of this
                     // block's second pass issued (its first pass was loaded during the previous block)
  kEmptyDone = 1,    // its tile is free (empty barrier passed; the first two blocks do not wait)
  kHalfStored = 2,   // first pass (32 candidates) decoded into the tile: includes waiting for its loads
  kTileReady = 3,    // next block's first-pass loads issued, second pass decoded, fenced: "full" next
};
enum ConsumerWord : int {
  kFullDone = 0,     // the tile is in shared memory ("full" barrier passed)
  kScoresDone = 1,   // S = Q·Kᵀ waited for
  kMaxDone = 2,      // masked scores and both halves' row maxima exchanged (first consumer barrier)
  kRescaleDone = 3,  // P rounded and stored for the other consumer, sums, O rescaled
  kSoftmaxDone = 4,  // the other consumer's P read (second barrier): P·V starts
  kPvDone = 5,       // O += P·V waited for
};
inline constexpr int kProducerWords = 4;
inline constexpr int kConsumerWords = 6;
inline constexpr int kWordsPerBlock = kProducerWords + 2 * kConsumerWords;
inline constexpr int kRecordWords = kHeaderWords + kMaxBlocksPerSplit * kWordsPerBlock;

inline constexpr int producer_word(int it, ProducerWord w) { return kHeaderWords + it * kWordsPerBlock + w; }
inline constexpr int consumer_word(int it, int consumer, ConsumerWord w) {
  return kHeaderWords + it * kWordsPerBlock + kProducerWords + consumer * kConsumerWords + w;
}

// Where the stamps go: records [capacity][kRecordWords] (u64, device memory), or null (recording off).
struct Buffer {
  std::uint64_t* records;
  int capacity;  // thread blocks with a record (blockIdx.x ≥ capacity record nothing)
};

// Sets the buffer the next launches of the 64-head (wgmma) kernel write to (null: stop). Synchronous.
// Defined in instantiate_h64.cu: without relocatable device code every translation unit has its own
// copy of g_buffer, and the kernel reads the copy of the unit that instantiates it.
void set_timeline_buffer(std::uint64_t* records, int capacity);

#ifdef __CUDACC__
[[maybe_unused]] static __constant__ Buffer g_buffer;

__device__ __forceinline__ std::uint64_t clock_now() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ std::uint64_t global_now() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ std::uint64_t* record() {
  return g_buffer.records != nullptr && blockIdx.x < static_cast<unsigned>(g_buffer.capacity)
             ? g_buffer.records + static_cast<std::size_t>(blockIdx.x) * kRecordWords
             : nullptr;
}
// Stamps `word` with the clock, by the leader of the calling warpgroup only.
__device__ __forceinline__ void mark(int word) {
  if (threadIdx.x % 128 != 0) return;
  if (std::uint64_t* r = record()) r[word] = clock_now();
}
__device__ __forceinline__ void mark_start() {
  if (threadIdx.x != 0) return;
  if (std::uint64_t* r = record()) {
    r[kStartGlobal] = global_now();
    r[kStartClock] = clock_now();
    std::uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
    r[kSmAndLive] = sm;
  }
}
__device__ __forceinline__ void mark_ready(int num_live) {
  if (threadIdx.x != 0) return;
  if (std::uint64_t* r = record()) {
    r[kReady] = clock_now();
    r[kSmAndLive] |= static_cast<std::uint64_t>(num_live) << 32;
  }
}
__device__ __forceinline__ void mark_end(int consumer) {
  if (threadIdx.x % 128 != 0) return;
  if (std::uint64_t* r = record()) {
    r[kEnd + consumer] = clock_now();
    r[kEndGlobal + consumer] = global_now();
  }
}
#endif  // __CUDACC__

}  // namespace dsv4::cuda::sparse_attention::timeline

// The statement runs only in a timeline build.
#define DSV4_TIMELINE(...) __VA_ARGS__

#else  // !DSV4_ATTENTION_TIMELINE

#define DSV4_TIMELINE(...)

#endif
