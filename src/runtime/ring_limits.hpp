// src/runtime/ring_limits.hpp — the bound on the extents that size the runtime's rings and records.
#pragma once

namespace dsv4 {

// Ratio, width, max_rollback, the sliding window and the window step are each at most this, so the
// int ring sizes and record widths computed from them stay in range.
inline constexpr int kMaxRingExtent = 1 << 24;

}  // namespace dsv4
