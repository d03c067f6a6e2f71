// bench/sparse_attention_timeline.hpp — reads the wgmma attention kernel's timeline records
// (src/cuda/sparse_attention/timeline.cuh) and prints where a block's time goes, per role.
//
// Only in a build with -DDSV4_ATTENTION_TIMELINE. Units: µs, from %clock64 differences on one SM,
// converted with the clock rate measured against %globaltimer over each thread block (median).
// Tables: per-phase percentiles over (thread block, live block), the producer/consumer critical
// path per block, the idle shares per thread block, and the grid (launch skew, gaps between the
// thread blocks of one SM).
#pragma once

#ifdef DSV4_ATTENTION_TIMELINE

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda/sparse_attention/timeline.cuh"

namespace dsv4::bench::attention_timeline {

namespace tl = dsv4::cuda::sparse_attention::timeline;

// A block waits "noticeably" when a barrier holds it longer than this (µs; ≈ 200 clock cycles).
inline constexpr double kWaitThresholdUs = 0.1;

struct Percentiles {
  std::size_t n = 0;
  double p10 = 0, p50 = 0, p90 = 0, max = 0, mean = 0;
};
inline Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  p.n = v.size();
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  const auto at = [&](double q) { return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)]; };
  p.p10 = at(0.1), p.p50 = at(0.5), p.p90 = at(0.9), p.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  return p;
}

// One thread block's record: words [tl::kRecordWords] as the kernel left them (unwritten = 0).
struct Cta {
  const std::uint64_t* w;
  int live() const { return static_cast<int>(w[tl::kSmAndLive] >> 32); }
  int sm() const { return static_cast<int>(w[tl::kSmAndLive] & 0xffffffffu); }
  std::uint64_t end_clock() const { return std::max(w[tl::kEnd], w[tl::kEnd + 1]); }
  std::uint64_t end_global() const { return std::max(w[tl::kEndGlobal], w[tl::kEndGlobal + 1]); }
  bool complete() const {
    return w[tl::kStartGlobal] != 0 && w[tl::kEnd] != 0 && w[tl::kEnd + 1] != 0 && w[tl::kReady] != 0;
  }
};

// Clock cycles per ns: the median over thread blocks of clock span / globaltimer span (≥ 2 µs).
inline double measured_clock_ghz(const std::vector<Cta>& ctas, double nominal_ghz) {
  std::vector<double> ratios;
  for (const Cta& c : ctas) {
    const double ns = static_cast<double>(c.end_global() - c.w[tl::kStartGlobal]);
    if (ns >= 2000) ratios.push_back(static_cast<double>(c.end_clock() - c.w[tl::kStartClock]) / ns);
  }
  return ratios.empty() ? nominal_ghz : percentiles(ratios).p50;
}

// Phase samples by name, in first-seen order, with the block index of each sample (−1: per thread block).
class Phases {
 public:
  void add(const std::string& name, double us, int it = -1) {
    auto [pos, inserted] = index_.try_emplace(name, names_.size());
    if (inserted) names_.push_back(name), samples_.emplace_back();
    samples_[pos->second].push_back({us, it});
  }
  void print(const char* title) const {
    std::printf("  %-34s %6s %7s %7s %7s %7s %7s | %8s %8s\n", title, "n", "p10", "p50", "p90", "max", "mean",
                "p50 it=0", "p50 it>1");
    for (std::size_t i = 0; i < names_.size(); ++i) {
      std::vector<double> all, first, steady;
      for (const auto& [us, it] : samples_[i]) {
        all.push_back(us);
        if (it == 0) first.push_back(us);
        if (it >= 2) steady.push_back(us);
      }
      const Percentiles p = percentiles(all);
      std::printf("  %-34s %6zu %7.3f %7.3f %7.3f %7.3f %7.3f |", names_[i].c_str(), p.n, p.p10, p.p50, p.p90, p.max,
                  p.mean);
      if (!first.empty() || !steady.empty())
        std::printf(" %8.3f %8.3f", percentiles(first).p50, percentiles(steady).p50);
      std::printf("\n");
    }
  }

 private:
  std::map<std::string, std::size_t> index_;
  std::vector<std::string> names_;
  std::vector<std::vector<std::pair<double, int>>> samples_;
};

// Prints the tables of one case and returns its JSON (raw stamps of every thread block that ran).
// records: [capacity][tl::kRecordWords] as copied back; timings: µs of the same call measured by events.
inline nlohmann::json analyze(const std::string& name, const std::vector<std::uint64_t>& records, double nominal_ghz,
                              const nlohmann::json& timings) {
  std::vector<Cta> ctas;
  for (std::size_t at = 0; at + tl::kRecordWords <= records.size(); at += tl::kRecordWords)
    if (records[at + tl::kStartGlobal] != 0) ctas.push_back({records.data() + at});
  const std::size_t incomplete = static_cast<std::size_t>(
      std::count_if(ctas.begin(), ctas.end(), [](const Cta& c) { return !c.complete(); }));
  std::erase_if(ctas, [](const Cta& c) { return !c.complete(); });
  const double ghz = measured_clock_ghz(ctas, nominal_ghz);
  const auto us = [&](std::uint64_t later, std::uint64_t earlier) {
    return (static_cast<double>(later) - static_cast<double>(earlier)) / (ghz * 1e3);
  };

  Phases cta_phases, producer, consumer;
  std::size_t producer_bound = 0, consumer_bound = 0, both_wait = 0, neither = 0;
  std::vector<double> share_prologue, share_full_wait, share_empty_wait, share_epilogue;
  for (const Cta& c : ctas) {
    const std::uint64_t* w = c.w;
    const int live = c.live();
    const double total = us(c.end_clock(), w[tl::kStartClock]);
    cta_phases.add("plan (slot table)", us(w[tl::kPlanDone], w[tl::kStartClock]));
    cta_phases.add("Q landed + barrier", us(w[tl::kReady], w[tl::kPlanDone]));
    double full_wait_sum = 0, empty_wait_sum = 0, epilogue_sum = 0;
    for (int it = 0; it < live; ++it) {
      const auto pw = [&](tl::ProducerWord word) { return w[tl::producer_word(it, word)]; };
      const std::uint64_t p_prev = it == 0 ? w[tl::kReady] : w[tl::producer_word(it - 1, tl::kTileReady)];
      producer.add("hand-over, prefetch, pass-1 loads", us(pw(tl::kLoadsIssued), p_prev), it);
      const double empty_wait = us(pw(tl::kEmptyDone), pw(tl::kLoadsIssued));
      producer.add("wait empty (consumers)", empty_wait, it);
      producer.add("decode pass 0 (incl. load wait)", us(pw(tl::kHalfStored), pw(tl::kEmptyDone)), it);
      producer.add("next loads + decode pass 1 + fence", us(pw(tl::kTileReady), pw(tl::kHalfStored)), it);
      producer.add("block (previous tile to this)", us(pw(tl::kTileReady), p_prev), it);
      empty_wait_sum += empty_wait;
      double block_full_wait = 0;
      for (int k = 0; k < 2; ++k) {
        const auto cw = [&](tl::ConsumerWord word) { return w[tl::consumer_word(it, k, word)]; };
        const std::uint64_t c_prev = it == 0 ? w[tl::kReady] : w[tl::consumer_word(it - 1, k, tl::kPvDone)];
        const double full_wait = us(cw(tl::kFullDone), c_prev);
        consumer.add("wait full (producer)", full_wait, it);
        consumer.add("S = Q.K^T (32 wgmma + wait)", us(cw(tl::kScoresDone), cw(tl::kFullDone)), it);
        consumer.add("mask + row max + barrier 1", us(cw(tl::kMaxDone), cw(tl::kScoresDone)), it);
        consumer.add("P to bf16, sums, rescale O", us(cw(tl::kRescaleDone), cw(tl::kMaxDone)), it);
        consumer.add("barrier 2 + read other P", us(cw(tl::kSoftmaxDone), cw(tl::kRescaleDone)), it);
        consumer.add("O += P.V (4 wgmma + wait)", us(cw(tl::kPvDone), cw(tl::kSoftmaxDone)), it);
        consumer.add("block (previous P.V to this)", us(cw(tl::kPvDone), c_prev), it);
        // Only the producer's first warp stamps: a long lag while the consumers waited means its
        // other warps finished later (or the barrier is slow to release).
        if (full_wait > kWaitThresholdUs)
          consumer.add("lag: full passed - producer leader", us(cw(tl::kFullDone), pw(tl::kTileReady)), it);
        block_full_wait = std::max(block_full_wait, full_wait);
        full_wait_sum += 0.5 * full_wait;
      }
      // Who the block waited for: the consumers on the producer's tile, or the producer on a free tile
      // (only from the third block on: the first two tiles are free from the start).
      const bool consumers_waited = it >= 1 && block_full_wait > kWaitThresholdUs;
      const bool producer_waited = it >= 2 && empty_wait > kWaitThresholdUs;
      if (it >= 2) {
        if (consumers_waited && producer_waited) ++both_wait;
        else if (consumers_waited) ++producer_bound;
        else if (producer_waited) ++consumer_bound;
        else ++neither;
      }
    }
    for (int k = 0; k < 2; ++k) {
      const double epilogue = us(w[tl::kEnd + k], w[tl::kEpilogueStart + k]);
      cta_phases.add("epilogue (normalize/merge, store)", epilogue);
      epilogue_sum += 0.5 * epilogue;
    }
    cta_phases.add("blocks (ready to last P.V)", us(std::max(w[tl::kEpilogueStart], w[tl::kEpilogueStart + 1]), w[tl::kReady]));
    cta_phases.add("producer exits before CTA end", us(c.end_clock(), w[tl::kProducerEnd]));
    cta_phases.add("thread block (start to last end)", total);
    cta_phases.add("per live block (blocks / live)",
                   live > 0 ? us(std::max(w[tl::kEpilogueStart], w[tl::kEpilogueStart + 1]), w[tl::kReady]) / live : 0);
    share_prologue.push_back(100 * us(w[tl::kReady], w[tl::kStartClock]) / total);
    share_full_wait.push_back(100 * full_wait_sum / total);
    share_empty_wait.push_back(100 * empty_wait_sum / total);
    share_epilogue.push_back(100 * epilogue_sum / total);
  }

  // The grid, on the global timer: launch skew and the gaps between thread blocks on one SM.
  std::uint64_t first_start = ~0ull, last_end = 0;
  for (const Cta& c : ctas) first_start = std::min(first_start, c.w[tl::kStartGlobal]), last_end = std::max(last_end, c.end_global());
  std::map<int, std::vector<const Cta*>> by_sm;
  std::vector<double> start_skew, sm_gaps;
  for (const Cta& c : ctas) {
    by_sm[c.sm()].push_back(&c);
    start_skew.push_back(static_cast<double>(c.w[tl::kStartGlobal] - first_start) / 1e3);
  }
  std::size_t most_per_sm = 0;
  for (auto& [sm, list] : by_sm) {
    std::sort(list.begin(), list.end(), [](const Cta* a, const Cta* b) { return a->w[tl::kStartGlobal] < b->w[tl::kStartGlobal]; });
    for (std::size_t i = 1; i < list.size(); ++i)
      sm_gaps.push_back((static_cast<double>(list[i]->w[tl::kStartGlobal]) - static_cast<double>(list[i - 1]->end_global())) / 1e3);
    most_per_sm = std::max(most_per_sm, list.size());
  }

  std::printf("\n=== timeline %s: %zu thread blocks (%zu incomplete records skipped) on %zu SMs, clock %.3f GHz "
              "(nominal %.3f)\n", name.c_str(), ctas.size(), incomplete, by_sm.size(), ghz, nominal_ghz);
  std::printf("  kernel span (globaltimer) %.2f us; events: %s\n",
              static_cast<double>(last_end - first_start) / 1e3, timings.dump().c_str());
  std::printf("-- per thread block (us)\n");
  cta_phases.print("phase");
  std::printf("-- producer warpgroup, per live block (us; leader thread of the warpgroup)\n");
  producer.print("phase");
  std::printf("-- consumer warpgroups 0 and 1, per live block (us)\n");
  consumer.print("phase");
  const std::size_t judged = producer_bound + consumer_bound + both_wait + neither;
  const auto pct = [&](std::size_t k) { return judged > 0 ? 100.0 * static_cast<double>(k) / static_cast<double>(judged) : 0.0; };
  std::printf("-- critical path of blocks it >= 2 (%zu; wait > %.2f us counts): producer-bound (consumers waited on full) "
              "%.0f%%, consumer-bound (producer waited on empty) %.0f%%, both waited (ping-pong) %.0f%%, neither %.0f%%\n",
              judged, kWaitThresholdUs, pct(producer_bound), pct(consumer_bound), pct(both_wait), pct(neither));
  std::printf("-- share of a thread block's time, p50 over blocks: prologue %.1f%%, consumers waiting on full %.1f%%, "
              "producer waiting on empty %.1f%%, epilogue %.1f%%\n",
              percentiles(share_prologue).p50, percentiles(share_full_wait).p50, percentiles(share_empty_wait).p50,
              percentiles(share_epilogue).p50);
  const Percentiles skew = percentiles(start_skew), gaps = percentiles(sm_gaps);
  std::printf("-- grid: start skew p50 %.2f / p90 %.2f / max %.2f us; up to %zu thread blocks per SM, gaps between "
              "them on one SM (%zu) p50 %.2f / p90 %.2f / max %.2f us\n",
              skew.p50, skew.p90, skew.max, most_per_sm, gaps.n, gaps.p50, gaps.p90, gaps.max);

  nlohmann::json raw = nlohmann::json::array();
  for (const Cta& c : ctas) {
    const int words = tl::kHeaderWords + c.live() * tl::kWordsPerBlock;
    raw.push_back({{"cta", static_cast<std::size_t>(c.w - records.data()) / tl::kRecordWords},
                   {"words", std::vector<std::uint64_t>(c.w, c.w + words)}});
  }
  return {{"name", name},
          {"clock_ghz", ghz},
          {"clock_ghz_nominal", nominal_ghz},
          {"timings_us", timings},
          {"layout",
           {{"header", "0 start globaltimer ns, 1 start clock, 2 plan done, 3 ready, 4 smid | live << 32, "
                       "5 producer end, 6-7 epilogue start (consumer 0, 1), 8-9 end, 10-11 end globaltimer ns"},
            {"block", "16 words per live block after the header: producer 0 loads issued, 1 empty done, "
                      "2 pass 0 stored, 3 tile ready; consumer k at 4 + 6k: 0 full done, 1 S done, 2 max done, "
                      "3 P stored + O rescaled, 4 other P read (P·V starts), 5 P·V done"},
            {"clock_words", "%clock64 of the thread block's SM"}}},
          {"records", raw}};
}

}  // namespace dsv4::bench::attention_timeline

#endif  // DSV4_ATTENTION_TIMELINE
