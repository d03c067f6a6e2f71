// src/runtime/compressor_state_access.hpp — host bookkeeping of a CompressorStatePool that only the
// library's compress / rollback / fork operations change (after they have validated everything).
#pragma once

#include <algorithm>
#include <cstdint>

#include "dsv4/compressor.hpp"
#include "runtime/slice_chains.hpp"

namespace dsv4 {

struct CompressorStateAccess {
  // After a step that brought the slot to `tokens` tokens: the rows and snapshots of the last
  // spec.max_rollback tokens are in the state, so a rollback may go back that far (never below an
  // earlier floor, e.g. a fork point).
  // `chains_kept`: the step's kernel folded every slice it completed into the slot's chains.
  static void advance(CompressorStatePool& pool, int slot, std::int64_t tokens, bool chains_kept) {
    const auto s = static_cast<std::size_t>(slot);
    pool.chains_complete_[s] =
        chains_complete_after_step(pool.chains_complete_[s], pool.tokens_[s], tokens, pool.spec_.ratio, chains_kept);
    pool.tokens_[s] = tokens;
    pool.rollback_floor_[s] = std::max(pool.rollback_floor_[s], tokens - pool.spec_.max_rollback);
  }
  static void rewind(CompressorStatePool& pool, int slot, std::int64_t tokens) {
    const auto s = static_cast<std::size_t>(slot);
    pool.chains_complete_[s] =
        chains_complete_after_rollback(pool.chains_complete_[s], pool.tokens_[s], tokens, pool.spec_.ratio);
    pool.tokens_[s] = tokens;
  }
  // A forked slot starts at `tokens` and may not roll back before it (its chains hold nothing).
  static void start_at(CompressorStatePool& pool, int slot, std::int64_t tokens) {
    pool.tokens_[static_cast<std::size_t>(slot)] = tokens;
    pool.rollback_floor_[static_cast<std::size_t>(slot)] = tokens;
    pool.chains_complete_[static_cast<std::size_t>(slot)] = chains_trivially_complete(tokens, pool.spec_.ratio);
  }
  static bool chains_complete(const CompressorStatePool& pool, int slot) {
    return pool.chains_complete_[static_cast<std::size_t>(slot)];
  }
  // The slice chains [num_slots, chain floats] (device), or null where the pool has none.
  static float* chains(const CompressorStatePool& pool) {
    return pool.chains_.data_as<float>();  // (a default Tensor's data is null)
  }
  // The slot's records [records_per_slot, record_floats] (device pointer on CUDA).
  static float* slot_records(const CompressorStatePool& pool, int slot) {
    return pool.storage_.data_as<float>() +
           static_cast<std::int64_t>(slot) * pool.records_per_slot_ * pool.record_floats_;
  }
};

}  // namespace dsv4
