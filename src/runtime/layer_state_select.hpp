// src/runtime/layer_state_select.hpp — the CSA selection of one window sub-step (SPEC §7), internal.
#pragma once

#include <cstdint>

#include "ref/layer_projections.hpp"
#include "runtime/layer_state_impl.hpp"

namespace dsv4 {

// For query rows [row_begin, row_begin + rows) of `p` (one request `s`, positions [rows]): the
// indexer's selection among the compressed entries visible to each query, written to `entries`
// [rows, K] as entry numbers in ascending order, −1 padded (V_t ≤ K: all V_t entries).
// Reads the indexer key cache, which already holds every entry the step completed.
void select_csa_entries(const detail::AttentionLayerImpl& layer, const LayerState& s, const ref::LayerProjections& p,
                        std::int64_t row_begin, std::int64_t rows, const std::int64_t* positions,
                        std::int32_t* entries);

}  // namespace dsv4
