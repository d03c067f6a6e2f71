// tests/testing/attention_pool.hpp — a host pool of random 584-byte attention entries, shared by
// the CPU and GPU sparse-attention suites.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dsv4/entry_codec.hpp"
#include "dsv4/sparse_attention.hpp"
#include "testing/testing.hpp"

namespace dsv4::testing {

struct RandomAttentionPool {
  using F = AttentionEntryFormat;
  int per_page = 0, num_pages = 0;
  std::vector<std::uint8_t> bytes;  // [num_pages, page_bytes]

  // Every slot (the null slot 0 too) holds bf16 normals scaled over `binades` powers of two centred
  // on 1, varying with the 64-value block and the slot, so blocks get different scales.
  RandomAttentionPool(std::mt19937_64& rng, int per_page_, int num_pages_, int binades)
      : per_page(per_page_), num_pages(num_pages_) {
    bytes.assign(static_cast<std::size_t>(F::page_bytes(per_page) * num_pages), 0);
    for (int slot = 0; slot < per_page * num_pages; ++slot) {
      std::vector<float> v = random_normal(rng, F::kDim);
      for (int k = 0; k < F::kDim; ++k)
        v[k] = round_to_bf16(v[k] * std::ldexp(1.0f, (k / 64 + slot) % binades - binades / 2));
      encode_attention_entry(v.data(), bytes.data() + (slot / per_page) * F::page_bytes(per_page), slot % per_page,
                             per_page);
    }
  }
  std::int64_t slots() const { return static_cast<std::int64_t>(per_page) * num_pages; }
  AttentionPoolView host_view() const {
    return {TensorView{const_cast<std::uint8_t*>(bytes.data()), DType::U8, {num_pages, F::page_bytes(per_page)}},
            per_page};
  }
};

}  // namespace dsv4::testing
