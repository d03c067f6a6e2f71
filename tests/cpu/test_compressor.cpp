// The compressor reference against an independent straightforward implementation (SPEC §4), and
// chunk invariance (SPEC §6): bit-identical rows and cache bytes for every chunking.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "compressor_testing.hpp"
#include "cuda/common/fast_divisor.hpp"
#include "cuda/compressor/config.hpp"
#include "cuda/compressor/params.hpp"
#include "runtime/slice_chains.hpp"

namespace dsv4 {
namespace {

using namespace compressor_testing;

using Case = SpecCase;

const std::vector<Case> kCases = model_and_other_ratio_cases();

class CompressorCases : public ::testing::TestWithParam<Case> {};

// A length that is not a multiple of m, with at least two complete blocks (and a small page size,
// so entries fill several pages).
std::int64_t stream_length(std::mt19937_64& rng, int m) {
  std::uniform_int_distribution<std::int64_t> tail(1, std::max(1, m - 1));
  const std::int64_t blocks = m >= 64 ? 2 : 9;
  return blocks * m + (m > 1 ? tail(rng) : 0);
}

TEST_P(CompressorCases, MatchesTheStraightforwardFormula) {
  const CompressorSpec spec = spec_of(GetParam());
  std::mt19937_64 rng(testing::fresh_seed());
  const Stream s = random_stream(rng, spec, stream_length(rng, spec.ratio));
  const int page_size = 4 * spec.ratio;
  const RunResult got = run_chunks(spec, s, {s.tokens}, page_size);
  const std::vector<float> want = naive_compressed(spec, s);
  ASSERT_EQ(got.compressed.size(), want.size());
  ASSERT_EQ(got.entries.size(), static_cast<std::size_t>(s.tokens / spec.ratio));
  // Two-pass: both accumulate in (long) double, so only the final float rounding can differ.
  // Online: float32 state between rows, SPEC §4 asks for 1e-5.
  EXPECT_LE(normwise_error(got.compressed, want), spec.online ? 1e-5 : 1e-6);

  // Post-processing and encoding, from the reference's own compressed rows: an independent
  // RMSNorm / RoPE / Hadamard may round a value to the neighbouring bf16 rarely, never further.
  int values = 0, different = 0, max_steps = 0;
  std::vector<std::uint8_t> page(static_cast<std::size_t>(spec.layout().page_bytes(1)));
  std::vector<std::uint8_t> want_entry(static_cast<std::size_t>(spec.layout().entry_bytes()));
  for (std::size_t n = 0; n < got.entries.size(); ++n) {
    const std::vector<float> values_n =
        naive_postprocess(spec, s.norm, got.compressed.data() + n * static_cast<std::size_t>(spec.width),
                          static_cast<std::int64_t>(n) * spec.ratio);
    spec.layout().encode(values_n.data(), page.data(), 0, 1);
    spec.layout().gather(page.data(), 0, 1, want_entry.data());
    const EntryDiff d = compare_entry(spec.layout(), got.entries[n].data(), want_entry.data());
    values += d.values;
    different += d.different;
    max_steps = std::max(max_steps, d.max_steps);
  }
  EXPECT_LE(max_steps, 1);
  EXPECT_LE(different, values / 100 + 1);
}

TEST_P(CompressorCases, ChunkInvariantBytes) {
  const CompressorSpec spec = spec_of(GetParam());
  std::mt19937_64 rng(testing::fresh_seed());
  const Stream s = random_stream(rng, spec, stream_length(rng, spec.ratio));
  const int page_size = 4 * spec.ratio;
  const RunResult whole = run_chunks(spec, s, {s.tokens}, page_size);
  ASSERT_FALSE(whole.entries.empty());
  const std::vector<std::vector<std::int64_t>> chunkings = {
      std::vector<std::int64_t>(static_cast<std::size_t>(s.tokens), 1),  // all single-token steps
      random_chunks(rng, s.tokens, 3),                                   // decode-like, drafts
      random_chunks(rng, s.tokens, 2 * spec.ratio + 5),                  // chunked prefill
      {s.tokens / 2, 0, s.tokens - s.tokens / 2},
  };
  for (const auto& chunks : chunkings) {
    const RunResult run = run_chunks(spec, s, chunks, page_size);
    EXPECT_EQ(run.compressed, whole.compressed) << chunks.size() << " chunks";
    EXPECT_EQ(run.cache, whole.cache) << chunks.size() << " chunks";
  }
}

// Chunk offsets within a block: a first chunk of k tokens, then the rest — every k < 2m for short
// blocks, the offsets around the block boundaries for long ones.
TEST_P(CompressorCases, EveryChunkOffsetWithinABlock) {
  const CompressorSpec spec = spec_of(GetParam());
  const std::int64_t m = spec.ratio;
  std::mt19937_64 rng(testing::fresh_seed());
  const Stream s = random_stream(rng, spec, 3 * m + 1);
  const RunResult whole = run_chunks(spec, s, {s.tokens}, 4 * spec.ratio);
  std::vector<std::int64_t> offsets;
  if (m <= 16) {
    for (std::int64_t k = 1; k < 2 * m; ++k) offsets.push_back(k);
  } else {
    offsets = {1, m / 2, m - 1, m, m + 1, 2 * m - 1, 2 * m};
  }
  for (const std::int64_t k : offsets) {
    const RunResult run = run_chunks(spec, s, {k, s.tokens - k}, 4 * spec.ratio);
    EXPECT_EQ(run.compressed, whole.compressed) << "first chunk " << k;
    EXPECT_EQ(run.cache, whole.cache) << "first chunk " << k;
  }
}

TEST_P(CompressorCases, ShortStreamsAndTheFirstBlock) {
  const CompressorSpec spec = spec_of(GetParam());
  std::mt19937_64 rng(testing::fresh_seed());
  const Stream s = random_stream(rng, spec, spec.ratio);
  SingleRequestCompressor comp(spec, s.ape_view(), s.norm_view(), s.tokens, 256 / spec.ratio * spec.ratio);
  const std::vector<std::uint8_t> zero_cache = comp.cache().host_bytes();
  // T < m: nothing is produced, the cache stays zero.
  const auto partial = comp.append(s.kv_rows(0, spec.ratio - 1), s.score_rows(0, spec.ratio - 1));
  EXPECT_EQ(partial.compressed.numel(), 0);
  EXPECT_EQ(comp.num_entries(), 0);
  EXPECT_EQ(comp.cache().host_bytes(), zero_cache);
  // The last token of block 0 completes entry 0 at position 0; with overlap, only block 0 counts.
  const auto first = comp.append(s.kv_rows(spec.ratio - 1, 1), s.score_rows(spec.ratio - 1, 1));
  ASSERT_EQ(first.compressed.numel(), spec.width);
  EXPECT_EQ(first.entry_ids, std::vector<std::int64_t>{0});
  EXPECT_EQ(first.positions, std::vector<std::int64_t>{0});
  const std::vector<float> got(first.compressed.data_as<float>(), first.compressed.data_as<float>() + spec.width);
  EXPECT_LE(normwise_error(got, naive_compressed(spec, s)), spec.online ? 1e-5 : 1e-6);
  EXPECT_NE(comp.cache().host_bytes(), zero_cache);
}

INSTANTIATE_TEST_SUITE_P(Specs, CompressorCases, ::testing::ValuesIn(kCases), spec_case_name);

// The CUDA compressor's division by a launch-fixed divisor (cuda/compressor/params.hpp, plain C++;
// the kernel uses the same formula with __umulhi): n / d exactly for every numerator < 2^32. All n
// below 2^16 and at every multiple of d ± 1 up to 2^20 for d = 1..300 (ratios, ring rows, entries
// per page), and random and boundary numerators for random divisors up to 2^31 − 1.
TEST(CompressorFastDivisor, DividesExactly) {
  using cuda::fast_divide_host;
  using cuda::make_fast_divisor;
  for (std::uint32_t d = 1; d <= 300; ++d) {
    const auto f = make_fast_divisor(d);
    for (std::uint32_t n = 0; n < (1u << 16); ++n) ASSERT_EQ(fast_divide_host(n, f), n / d) << n << " / " << d;
    for (std::uint32_t q = 1; q * d < (1u << 20); ++q) {
      for (const std::uint32_t n : {q * d - 1, q * d, q * d + 1}) ASSERT_EQ(fast_divide_host(n, f), n / d) << n << " / " << d;
    }
  }
  std::mt19937_64 rng(testing::fresh_seed());
  std::uniform_int_distribution<std::uint32_t> divisor(1, 0x7fffffffu), numerator;
  for (int i = 0; i < 100000; ++i) {
    const std::uint32_t d = i % 2 ? divisor(rng) : divisor(rng) % 4096 + 1;
    const auto f = make_fast_divisor(d);
    const std::uint32_t top = 0xffffffffu / d * d;  // the largest multiple of d below 2^32
    for (const std::uint32_t n : {numerator(rng), 0u, d - 1, d, top - 1, top, 0xffffffffu, 0x7fffffffu}) {
      ASSERT_EQ(fast_divide_host(n, f), n / d) << n << " / " << d;
    }
  }
}

// The online kernel's snapshot writes (cuda/compressor/online.cuh), modelled item by item with the
// kernel's own rule (params.hpp, online_kept_counts): the head runs the first block (from the
// prefix), body e runs block prefix/m + e from its first row, and the head re-runs the last, partial
// block. Every kept count (the last max_rollback + 1, none at or below the prefix) is written exactly
// once, by an item whose chain reached that row; and the rule has a mid-block head's starting
// snapshot saved first exactly where a body writes its slot.
TEST(CompressorOnlineSnapshots, KeptCountsAreWrittenOnceAndTheHeadsSnapshotIsSaved) {
  long checked_steps = 0, steps_with_body_snapshots = 0, steps_saving = 0, bodies_on_the_heads_slot = 0;
  for (const int m : {1, 2, 3, 4, 8, 16, 128}) {
    for (const int max_rollback : {0, 1, 2, 7, 8, 15}) {
      const int slots = max_rollback + 1;
      for (std::int64_t prefix = 0; prefix <= 3 * m + 20; ++prefix) {
        for (std::int64_t tokens = 1; tokens <= 5 * m + 20; ++tokens) {
          const std::int64_t end = prefix + tokens;
          const int events = static_cast<int>(end / m - prefix / m);
          const cuda::compressor::OnlineKeptCounts kept =
              cuda::compressor::online_kept_counts(prefix, tokens, events, m, max_rollback);
          ASSERT_EQ(kept.keep_from, std::max(end - max_rollback, prefix + 1));
          ASSERT_EQ(kept.first_block_start, prefix / m * m);
          ASSERT_EQ(kept.first_block_end, std::min(end, prefix / m * m + m));
          std::vector<int> writes(static_cast<std::size_t>(end + 1), 0);
          std::vector<bool> by_body(writes.size(), false);
          // Counts (from, to] that the rows [from, to) bring, written where kept.
          const auto run = [&](std::int64_t from, std::int64_t to, bool body) {
            for (std::int64_t count = from + 1; count <= to; ++count) {
              if (count < kept.keep_from) continue;
              ++writes[static_cast<std::size_t>(count)];
              by_body[static_cast<std::size_t>(count)] = body;
            }
          };
          run(prefix, kept.first_block_end, false);  // the head's first block
          for (int e = 1; e < events; ++e) {
            const std::int64_t start = (prefix / m + e) * m;
            run(start, start + m, true);
          }
          if (kept.first_block_end < end) {  // the head's re-run of the last, partial block
            const std::int64_t rerun_from = end / m * m;
            ASSERT_GE(rerun_from, kept.first_block_end);
            if (rerun_from < end) run(rerun_from, end, false);
          }
          const std::string where = "m " + std::to_string(m) + " R " + std::to_string(slots) + " prefix " +
                                    std::to_string(prefix) + " tokens " + std::to_string(tokens);
          bool any_body = false, body_on_the_heads_slot = false;
          for (std::int64_t count = prefix + 1; count <= end; ++count) {
            const bool kept_count = count >= kept.keep_from;
            ASSERT_EQ(writes[static_cast<std::size_t>(count)], kept_count ? 1 : 0) << where << " count " << count;
            if (!by_body[static_cast<std::size_t>(count)]) continue;
            any_body = true;
            // (The head itself writes only after reading its snapshot.)
            if (prefix != kept.first_block_start && count % slots == prefix % slots) body_on_the_heads_slot = true;
          }
          // Saved exactly where a body would overwrite the head's snapshot.
          ASSERT_EQ(kept.start_saved, body_on_the_heads_slot) << where;
          bodies_on_the_heads_slot += body_on_the_heads_slot;
          ++checked_steps;
          steps_with_body_snapshots += any_body;
          steps_saving += kept.start_saved;
        }
      }
    }
  }
  // Every rule was reached (the sweep is not vacuous).
  EXPECT_GT(steps_with_body_snapshots, 10000);
  EXPECT_GT(checked_steps, 1000000);
  EXPECT_GT(steps_saving, 1000);
  EXPECT_GT(bodies_on_the_heads_slot, 1000);
}

// The host's rule for a pool's slice chains (runtime/slice_chains.hpp) against a model of what the
// kernel stores and reads (cuda/compressor/two_pass.cuh, keep_slice_chains: per group two buffers by
// the parity of the chain's last slice), for every ratio and group count the device keeps chains for
// (cuda::slice_chain_floats: no overlap, 24..128 rows; 2 groups at c = 512, 4 at c = 128): random
// steps — decode steps of 1..8 tokens that keep the chains where the rule lets them (folds sometimes
// repeated, as a replayed step does), longer or unkept steps that do not touch them, rollbacks (whose
// floor is the highest count − max_rollback) — counting the kept steps whose fold or event reads
// chains that do not hold exactly the open block's slices they stand for. Buffers never written hold
// a marker (the pool starts zeroed, which is no empty chain), so a read of one counts.
struct SliceChainModelCounts {
  long stale_reads = 0, folds = 0, repeated_folds = 0, chained_events = 0, refolds_after_rollback = 0,
       rollbacks_lost = 0;
};
SliceChainModelCounts run_slice_chain_model(int max_rollback, std::mt19937_64& rng) {
  SliceChainModelCounts counts;
  const std::vector<int> never_written = {-1};
  for (int m = 24; m <= 128; m += kChainSliceRows) {
    for (const int groups : {2, 4}) {
      const int slices = m / kChainSliceRows;
      const auto first_of = [&](int g) { return g * slices / groups; };  // group g: [first_of(g), first_of(g + 1))
      const auto group_of = [&](int slice) {
        int g = 0;
        while (first_of(g + 1) <= slice) ++g;
        return g;
      };
      const auto range = [&](int from, int to) {
        std::vector<int> v;
        for (int sl = from; sl < to; ++sl) v.push_back(sl);
        return v;
      };
      for (int run = 0; run < 30; ++run) {
        // The device's buffers: [group][parity] → the slices folded into it.
        std::vector<std::array<std::vector<int>, 2>> buffer(static_cast<std::size_t>(groups), {never_written, never_written});
        // What the kernel reads as group g's chain through `slice` (empty before the group's range).
        const auto chain_through = [&](int g, int slice) {
          return slice < first_of(g) ? std::vector<int>{} : buffer[static_cast<std::size_t>(g)][static_cast<std::size_t>(slice % 2)];
        };
        std::int64_t tokens = 0, highest = 0;
        bool complete = true;  // a fresh slot
        int last_dropped = -1;
        for (int step = 0; step < 300; ++step) {
          const int kind = static_cast<int>(rng() % 10);
          if (kind <= 1 && tokens > 0) {  // a rollback of up to max_rollback tokens (not below the floor)
            const std::int64_t to = std::max<std::int64_t>(
                {highest - max_rollback, tokens - static_cast<std::int64_t>(rng() % (max_rollback + 1)), 0});
            const bool before = complete;
            complete = chains_complete_after_rollback(complete, tokens, to, m);
            counts.rollbacks_lost += before && !complete;
            if (to / kChainSliceRows < tokens / kChainSliceRows) last_dropped = static_cast<int>(to % m) / kChainSliceRows;
            tokens = to;
            continue;
          }
          const bool decode = kind < 8;
          const std::int64_t n = decode ? 1 + static_cast<std::int64_t>(rng() % kChainSliceRows)
                                        : 9 + static_cast<std::int64_t>(rng() % (3 * m));
          const std::int64_t end = tokens + n;
          // The launch keeps the chains for a decode step whose chains are complete (not always: a
          // step the split path cannot run keeps none).
          const bool kept = decode && complete && rng() % 4 != 0;
          if (kept) {
            const int done_before = static_cast<int>(tokens % m) / kChainSliceRows;
            if (end / m > tokens / m) {  // the event: each group's chain through its last slice before the last
              for (int g = 0; g < groups; ++g) {
                const int through = std::min(first_of(g + 1), slices - 1) - 1;
                counts.stale_reads += chain_through(g, through) != range(first_of(g), through + 1);
              }
              ++counts.chained_events;
            } else if (static_cast<int>(end % m) / kChainSliceRows > done_before) {  // one slice completed
              const int slice = static_cast<int>(end % m) / kChainSliceRows - 1;
              const int g = group_of(slice);
              std::vector<int> chain = chain_through(g, slice - 1);
              counts.stale_reads += chain != range(first_of(g), slice);
              chain.push_back(slice);
              const int repeats = rng() % 8 == 0 ? 2 : 1;  // a replayed step folds again: the same values
              for (int k = 0; k < repeats; ++k) buffer[static_cast<std::size_t>(g)][static_cast<std::size_t>(slice % 2)] = chain;
              counts.repeated_folds += repeats - 1;
              counts.refolds_after_rollback += slice == last_dropped;
              ++counts.folds;
            }
          }
          complete = chains_complete_after_step(complete, tokens, end, m, kept);
          tokens = end;
          highest = std::max(highest, tokens);
        }
      }
    }
  }
  return counts;
}

TEST(CompressorSliceChains, KeptStepsReadChainsHoldingTheOpenBlocksSlices) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (int max_rollback = 0; max_rollback <= kChainSliceRows; ++max_rollback) {
    ASSERT_TRUE(rollbacks_keep_chains_exact(max_rollback));
    const SliceChainModelCounts counts = run_slice_chain_model(max_rollback, rng);
    EXPECT_EQ(counts.stale_reads, 0) << "max_rollback " << max_rollback;
    EXPECT_GT(counts.folds, 10000);
    EXPECT_GT(counts.repeated_folds, 1000);
    EXPECT_GT(counts.chained_events, 200);
    if (max_rollback >= 2) {  // (smaller rollbacks rarely cross a slice boundary)
      EXPECT_GT(counts.refolds_after_rollback, 100) << "max_rollback " << max_rollback;
      EXPECT_GT(counts.rollbacks_lost, 10) << "max_rollback " << max_rollback;
    }
  }
}

// Why pools keep no chains past max_rollback = 8 (rollbacks_keep_chains_exact): the same model with a
// deeper floor lets two rollbacks in a row drop two slices, and the refold reads a stale chain.
TEST(CompressorSliceChains, DeeperRollbacksWouldReadStaleChains) {
  std::mt19937_64 rng(testing::fresh_seed());
  long stale = 0;
  for (int max_rollback = kChainSliceRows + 1; max_rollback <= 2 * kChainSliceRows; ++max_rollback) {
    EXPECT_FALSE(rollbacks_keep_chains_exact(max_rollback));
    stale += run_slice_chain_model(max_rollback, rng).stale_reads;
  }
  EXPECT_GT(stale, 0);
}

// A two-pass prefill's ring write spread over ring pieces (cuda/compressor/config.hpp,
// ring_write_pieces; two_pass.cuh write_ring_direct): piece k of P runs rounds k, k + P, ... of the
// write, so the pieces visit every round exactly once — with one round each up to the cap, and the
// rest by the stride past it.
TEST(CompressorRingPieces, PiecesVisitEveryRoundOnce) {
  using cuda::compressor::kMaxRingPieces;
  using cuda::compressor::kRingVectorsInRegisters;
  for (const int unit_threads : {32, 128, 256}) {
    for (const int record_floats : {2 * 2 * 128, 2 * 2 * 512, 2 * 512, 2 * 128}) {
      for (int rows = 1; rows <= 300; ++rows) {
        const int pieces = cuda::compressor::ring_write_pieces(rows, record_floats, unit_threads);
        const int vectors = rows * record_floats / 4, round = kRingVectorsInRegisters * unit_threads;
        const int rounds = (vectors + round - 1) / round;
        ASSERT_EQ(pieces, std::clamp(rounds, 1, kMaxRingPieces)) << rows << " rows";
        std::vector<int> visits(static_cast<std::size_t>(rounds), 0);
        for (int piece = 0; piece < pieces; ++piece) {
          for (int base = piece * round; base < vectors; base += pieces * round) ++visits[static_cast<std::size_t>(base / round)];
        }
        for (int r = 0; r < rounds; ++r) ASSERT_EQ(visits[static_cast<std::size_t>(r)], 1) << rows << " rows, round " << r;
      }
    }
  }
}

// The split units' rule (cuda/compressor/params.hpp, split_units_by_waves): a power of two in
// [1, max], the old rule's units (the largest whose split blocks fit the slots) when nothing else is
// in the grid, and never more waves than at the units it started from; and a T = 8K C128 prefill on an
// H200 (64 events, 18 heads and ring pieces, 264 slots) takes 2 units, one wave, where the split
// blocks alone would have taken 4 and two waves.
TEST(CompressorSplitUnits, HalvedWhileThatSavesAWave) {
  using cuda::compressor::split_units_by_waves;
  const auto waves = [](std::int64_t events, int units, std::int64_t other, std::int64_t slots) {
    return (events * units + other + slots - 1) / slots;
  };
  long checked = 0, halved_for_others = 0;
  for (const int max_units : {4, 8}) {
    for (const std::int64_t slots : {132, 264, 528}) {
      for (std::int64_t events = 1; events <= 600; events += 1 + events / 16) {
        int old_rule = max_units;
        while (old_rule > 1 && events * old_rule > slots) old_rule /= 2;
        ASSERT_EQ(split_units_by_waves(events, 0, slots, max_units), old_rule) << events << " events";
        for (std::int64_t other = 0; other <= 1200; other += 1 + other / 8) {
          const int units = split_units_by_waves(events, other, slots, max_units);
          ASSERT_TRUE(units >= 1 && units <= max_units && (units & (units - 1)) == 0) << units;
          ASSERT_LE(waves(events, units, other, slots), waves(events, max_units, other, slots));
          if (units > 1) {  // stopped where halving saves no wave
            ASSERT_EQ(waves(events, units / 2, other, slots), waves(events, units, other, slots));
          }
          halved_for_others += units < split_units_by_waves(events, 0, slots, max_units);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 10000);
  EXPECT_GT(halved_for_others, 100);  // the other blocks do change the choice somewhere
  EXPECT_EQ(split_units_by_waves(64, 18, 264, 8), 2);
  EXPECT_EQ(split_units_by_waves(64, 0, 264, 8), 4);
}

// SPEC §4: the online recurrence equals the two-pass softmax to float32 rounding.
TEST(CompressorOnline, AgreesWithTwoPassWithin1e5) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (int m : {128, 16, 3}) {
    const CompressorSpec two_pass = make_spec(m, false, EntryKind::Attention, false);
    const CompressorSpec online = make_spec(m, false, EntryKind::Attention, true);
    const Stream s = random_stream(rng, two_pass, 3 * m + 2);
    const RunResult a = run_chunks(two_pass, s, {s.tokens}, 4 * m);
    const RunResult b = run_chunks(online, s, random_chunks(rng, s.tokens, m), 4 * m);
    EXPECT_LE(normwise_error(b.compressed, a.compressed), 1e-5) << "m=" << m;
    int values = 0, different = 0, max_steps = 0;
    for (std::size_t n = 0; n < a.entries.size(); ++n) {
      const EntryDiff d = compare_entry(two_pass.layout(), b.entries[n].data(), a.entries[n].data());
      values += d.values;
      different += d.different;
      max_steps = std::max(max_steps, d.max_steps);
    }
    // The codes mostly agree. No bound on how far a differing code moves: a block of small values has
    // steps far below the 1e-5 normwise error (seed 11577749131620609947, m = 16: 7 steps), and two
    // values near zero may round to codes of opposite signs (seed 4996309344256116866).
    EXPECT_LE(different, values / 50 + 1) << "m=" << m << " (largest difference " << max_steps << " steps)";
  }
}

}  // namespace
}  // namespace dsv4
