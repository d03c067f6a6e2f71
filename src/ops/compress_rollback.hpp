// src/ops/compress_rollback.hpp — rollback() in its two halves, for callers that roll back several pools
// as one operation (AttentionLayer: the compressor's and the indexer's): validate every pool first, then
// change them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dsv4/compressor.hpp"

namespace dsv4::detail {

// rollback()'s checks (Error naming the argument; nothing changes): the cache slots of the entries the
// dropped tokens completed, to clear.
std::vector<std::int64_t> checked_rollback(const CompressorStatePool& pool, int slot, std::int64_t n,
                                           const PagedCache& cache, std::span<const std::int32_t> page_table);

// Clears `slots` (from checked_rollback of the same arguments) and returns the slot to n tokens earlier.
void apply_rollback(CompressorStatePool& pool, int slot, std::int64_t n, PagedCache& cache,
                    const std::vector<std::int64_t>& slots, void* stream = nullptr);

}  // namespace dsv4::detail
