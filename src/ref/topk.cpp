// src/ref/topk.cpp — CPU reference of the indexer's top-k selection (SPEC §7).
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "dsv4/cache_format.hpp"
#include "dsv4/topk.hpp"
#include "ref/indexer_ref.hpp"

namespace dsv4::ref {

void indexer_topk(const IndexerTopkCall& call) {
  std::vector<std::pair<std::uint32_t, std::int32_t>> ranked;  // (order key, entry)
  std::vector<std::int32_t> chosen;
  for (std::int64_t t = 0; t < call.num_rows; ++t) {
    const std::int32_t visible = call.rows.visible[t];
    const float* row = call.scores + t * call.num_cols;
    chosen.clear();
    if (visible <= call.k) {
      for (std::int32_t s = 0; s < visible; ++s) chosen.push_back(s);
    } else {
      ranked.clear();
      for (std::int32_t s = 0; s < visible; ++s) ranked.emplace_back(topk_order_key(row[s]), s);
      // Larger key first; among equal keys the lower entry first.
      const auto before = [](const auto& a, const auto& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      };
      std::nth_element(ranked.begin(), ranked.begin() + (call.k - 1), ranked.end(), before);
      for (int i = 0; i < call.k; ++i) chosen.push_back(ranked[static_cast<std::size_t>(i)].second);
      std::sort(chosen.begin(), chosen.end());
    }
    std::int32_t* indices = call.indices + t * call.k;
    std::int32_t* slots = call.slots ? call.slots + t * call.k : nullptr;
    const std::int32_t* page_row = nullptr;
    if (slots) {
      const int b = request_of_row(call.rows.query_start, call.rows.num_requests, t);
      page_row = call.rows.page_table + static_cast<std::int64_t>(b) * call.rows.max_pages;
    }
    for (int i = 0; i < call.k; ++i) {
      const bool used = i < static_cast<int>(chosen.size());
      const std::int32_t s = used ? chosen[static_cast<std::size_t>(i)] : -1;
      indices[i] = s;
      if (slots)
        slots[i] = used ? static_cast<std::int32_t>(physical_slot(page_row, s, call.entries_per_page)) : -1;
    }
  }
}

}  // namespace dsv4::ref
