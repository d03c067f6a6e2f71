// src/cuda/indexer/ptx_sm90.cuh — the PTX only the indexer kernels use (the shared sm_90a helpers are in
// cuda/common/ptx_sm90.cuh), each behind a small wrapper.
//
// Note: mma.sync with e4m3 operands compiles for sm_90a but is emulated there (F2FP conversions to
// f16 and HMMA in the SASS); Hopper's FP8 tensor-core path is wgmma only.
#pragma once

#include <cstdint>

#include "cuda/common/ptx_sm90.cuh"

namespace dsv4::cuda::ptx {

// ---- wgmma (sm_90a); descriptors, fences and streaming loads: cuda/common/ptx_sm90.cuh ------------

// D[64×64] (+)= A[64×32] · B[32×64], e4m3 → f32; A from registers (per warp w of the warpgroup:
// a0 = A[16w+g][4q..4q+3], a1 = A[16w+g+8][4q..], a2 = A[16w+g][16+4q..], a3 = A[16w+g+8][16+4q..]),
// B K-major in shared memory (`descriptor_b`). d[4j+i]: row 16w + g + 8·(i/2), column 8j + 2q + i%2.
__device__ __forceinline__ void wgmma_m64n64k32_e4m3_rs(float (&d)[32], std::uint32_t a0, std::uint32_t a1,
                                                       std::uint32_t a2, std::uint32_t a3,
                                                       std::uint64_t descriptor_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(descriptor_b), "r"(static_cast<int>(accumulate)));
}

// Streaming loads (as load_stream_v4 / load_stream_u32) that only happen when `enabled`; otherwise the
// result is unspecified (whatever the register held) and nothing is read.
__device__ __forceinline__ uint4 load_stream_v4_if(bool enabled, const void* address) {
  uint4 v;
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %5, 0;\n@p ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(address), "r"(static_cast<int>(enabled)));
  return v;
}

// The u32 at `address` when `enabled`, else `otherwise` (nothing is read).
__device__ __forceinline__ std::uint32_t load_stream_u32_or(bool enabled, const void* address, std::uint32_t otherwise) {
  std::uint32_t v = otherwise;
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p ld.global.nc.L1::no_allocate.u32 %0, [%1];\n}\n"
               : "+r"(v)
               : "l"(address), "r"(static_cast<int>(enabled)));
  return v;
}

}  // namespace dsv4::cuda::ptx
