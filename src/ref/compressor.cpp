// src/ref/compressor.cpp — the exact CPU reference of the compressors (SPEC §4–§6).
//
// Plain, readable code: softmax pooling with max subtraction and double accumulation, the online
// (M, S, V) recurrence in double rounded to the float32 state after every row, and the rounding
// points of the post-processing exactly as written in the SPEC. Requests of a step never share a
// state slot (plan_compress checks it), so each request reads its old state, computes every event,
// and only then writes its new state.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dsv4/formats.hpp"
#include "dsv4/norms.hpp"
#include "ref/compressor_ref.hpp"

namespace dsv4::ref {

namespace {

void round_all_to_bf16(float* x, int n) {
  for (int k = 0; k < n; ++k) x[k] = round_to_bf16(x[k]);
}

// The token rows of one request as the step sees them: positions below the prefix come from the
// state ring (score already includes ape), the others from this step's new rows (ape added here,
// as one float32 addition — the same one the ring stored).
class RequestRows {
 public:
  RequestRows(const CompressArgs& a, const PlannedRequest& r) : a_(a), r_(r) {
    ring_ = a.state + static_cast<std::int64_t>(r.slot) * a.records_per_slot * a.record_floats;
  }
  // Channel `k` (0 ≤ k < coff·c) of token p's kv row.
  float value(std::int64_t p, int k) const {
    if (p >= r_.prefix_len) return a_.kv[(r_.row_begin + p - r_.prefix_len) * a_.kv_stride + k];
    return ring_row(p)[k];
  }
  // Channel `k` of token p's score, ape included.
  float score(std::int64_t p, int k) const {
    if (p >= r_.prefix_len) {
      const int m = a_.spec->ratio;
      return a_.score[(r_.row_begin + p - r_.prefix_len) * a_.score_stride + k] +
             a_.ape[(p % m) * a_.spec->row_width() + k];
    }
    return ring_row(p)[a_.spec->row_width() + k];
  }
  // Two-pass: stores the rows the state must keep after this step (the last R of the stream).
  void write_ring() const {
    const std::int64_t end = r_.prefix_len + r_.new_tokens;
    const int width = a_.spec->row_width();
    for (std::int64_t p = std::max(r_.prefix_len, end - a_.records_per_slot); p < end; ++p) {
      float* row = ring_ + (p % a_.records_per_slot) * a_.record_floats;
      for (int k = 0; k < width; ++k) {
        row[k] = value(p, k);
        row[width + k] = score(p, k);
      }
    }
  }

 private:
  const float* ring_row(std::int64_t p) const { return ring_ + (p % a_.records_per_slot) * a_.record_floats; }
  const CompressArgs& a_;
  const PlannedRequest& r_;
  float* ring_;  // [records_per_slot, record_floats] of this request's slot
};

// C_n[k] for k < c: the softmax over the candidates of block n (SPEC §4). Candidate order: the b
// branch of block n−1 (overlap, n ≥ 1), then block n, each in ascending position.
void pool_block(const CompressorSpec& spec, const RequestRows& rows, std::int64_t n, float* out /*[c]*/) {
  const int m = spec.ratio, c = spec.width;
  const std::int64_t begin = n * m;
  const int a_offset = spec.overlap ? c : 0;  // a branch channels [c, 2c) with overlap
  std::vector<float> values, scores;
  for (int k = 0; k < c; ++k) {
    values.clear();
    scores.clear();
    if (spec.overlap && n >= 1) {
      for (std::int64_t p = begin - m; p < begin; ++p) {
        values.push_back(rows.value(p, k));
        scores.push_back(rows.score(p, k));
      }
    }
    for (std::int64_t p = begin; p < begin + m; ++p) {
      values.push_back(rows.value(p, a_offset + k));
      scores.push_back(rows.score(p, a_offset + k));
    }
    const double max_score = *std::max_element(scores.begin(), scores.end());
    double weighted = 0.0, total = 0.0;
    for (std::size_t j = 0; j < scores.size(); ++j) {
      const double w = std::exp(static_cast<double>(scores[j]) - max_score);
      weighted += w * values[j];
      total += w;
    }
    out[k] = static_cast<float>(weighted / total);
  }
}

// The online recurrence for one row (SPEC §4), computed in double and rounded to the float32 state.
void online_update(bool first_row, float s, float v, float& M, float& S, float& V) {
  if (first_row) {
    M = s;
    S = 1.0f;
    V = v;
    return;
  }
  const double new_max = std::max(M, s);
  const double old_weight = std::exp(static_cast<double>(M) - new_max);
  const double new_weight = std::exp(static_cast<double>(s) - new_max);
  const double new_sum = static_cast<double>(S) * old_weight + new_weight;
  const double new_mean = (static_cast<double>(V) * S * old_weight + static_cast<double>(v) * new_weight) / new_sum;
  M = static_cast<float>(new_max);
  S = static_cast<float>(new_sum);
  V = static_cast<float>(new_mean);
}

class EventWriter {
 public:
  explicit EventWriter(const CompressArgs& a) : a_(a), rope_(a.spec->rope), values_(static_cast<std::size_t>(a.spec->width)) {}

  // Post-processes C_n of event `e`, stores the entry into its cache slot and fills the outputs.
  void write(std::int64_t e, const float* compressed /*[c]*/) {
    const CompressorSpec& spec = *a_.spec;
    const PlannedEvent& ev = a_.plan->events[static_cast<std::size_t>(e)];
    const std::int64_t position = ev.entry * spec.ratio;
    const int c = spec.width;
    if (a_.out_compressed) std::memcpy(a_.out_compressed + e * c, compressed, sizeof(float) * static_cast<std::size_t>(c));
    if (a_.out_entry_ids) a_.out_entry_ids[e] = static_cast<std::int32_t>(ev.entry);
    if (a_.out_positions) a_.out_positions[e] = static_cast<std::int32_t>(position);
    if (a_.out_cache_slots) a_.out_cache_slots[e] = ev.cache_slot;
    postprocess_entry(spec, rope_, a_.norm, compressed, position, values_.data());
    std::uint8_t* page = a_.cache + (ev.cache_slot / a_.entries_per_page) * a_.page_bytes;
    spec.layout().encode(values_.data(), page, ev.cache_slot % a_.entries_per_page, a_.entries_per_page);
  }

 private:
  const CompressArgs& a_;
  RopeTable rope_;
  std::vector<float> values_;  // [c]
};

void compress_two_pass(const CompressArgs& a, const PlannedRequest& r, EventWriter& writer) {
  const RequestRows rows(a, r);
  std::vector<float> compressed(static_cast<std::size_t>(a.spec->width));
  const std::int64_t first_entry = r.prefix_len / a.spec->ratio;
  for (std::int64_t j = 0; j < r.num_events; ++j) {
    pool_block(*a.spec, rows, first_entry + j, compressed.data());
    writer.write(r.first_event + j, compressed.data());
  }
  rows.write_ring();  // after every read of the old ring
}

void compress_online(const CompressArgs& a, const PlannedRequest& r, EventWriter& writer) {
  const CompressorSpec& spec = *a.spec;
  const int m = spec.ratio, c = spec.width;
  const RequestRows rows(a, r);
  float* snapshots = a.state + static_cast<std::int64_t>(r.slot) * a.records_per_slot * a.record_floats;
  const auto snapshot = [&](std::int64_t count) { return snapshots + (count % a.records_per_slot) * a.record_floats; };

  std::vector<float> state(static_cast<std::size_t>(3 * c));  // M | S | V of the open block
  float* M = state.data();
  float* S = M + c;
  float* V = S + c;
  if (r.prefix_len % m != 0) std::memcpy(state.data(), snapshot(r.prefix_len), sizeof(float) * state.size());

  const std::int64_t end = r.prefix_len + r.new_tokens;
  const std::int64_t first_kept = std::max(r.prefix_len + 1, end - spec.max_rollback);  // counts to snapshot
  std::vector<float> kept;  // snapshots for counts first_kept..end, written after the scan
  std::int64_t event = r.first_event;
  for (std::int64_t p = r.prefix_len; p < end; ++p) {
    for (int k = 0; k < c; ++k) online_update(p % m == 0, rows.score(p, k), rows.value(p, k), M[k], S[k], V[k]);
    if ((p + 1) % m == 0) writer.write(event++, V);
    if (p + 1 >= first_kept) kept.insert(kept.end(), state.begin(), state.end());
  }
  for (std::int64_t count = first_kept; count <= end; ++count) {
    std::memcpy(snapshot(count), kept.data() + (count - first_kept) * 3 * c, sizeof(float) * state.size());
  }
}

}  // namespace

void postprocess_entry(const CompressorSpec& spec, const RopeTable& rope, const float* norm, const float* compressed,
                       std::int64_t position, float* values) {
  const int c = spec.width;
  std::memmove(values, compressed, sizeof(float) * static_cast<std::size_t>(c));
  round_all_to_bf16(values, c);
  rms_norm(values, norm, c, spec.eps, values);
  round_all_to_bf16(values, c);
  apply_rope_to_tail(rope, values, c, position);
  round_all_to_bf16(values, c);
  if (spec.output != EntryKind::Attention) {
    walsh_hadamard(values, c);
    round_all_to_bf16(values, c);
  }
}

void compress(const CompressArgs& a) {
  EventWriter writer(a);
  for (const PlannedRequest& r : a.plan->requests) {
    if (r.new_tokens == 0) continue;
    if (a.spec->online) {
      compress_online(a, r, writer);
    } else {
      compress_two_pass(a, r, writer);
    }
  }
}

}  // namespace dsv4::ref
