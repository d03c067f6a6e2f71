// src/cuda/indexer/ptx_sm90.cuh — the PTX the indexer kernels use, each behind a small wrapper.
//
// Note: mma.sync with e4m3 operands compiles for sm_90a but is emulated there (F2FP conversions to
// f16 and HMMA in the SASS); Hopper's FP8 tensor-core path is wgmma only.
#pragma once

#include <cstdint>

namespace dsv4::cuda::ptx {

// ---- wgmma (sm_90a) ------------------------------------------------------------------------------

// Shared-memory matrix descriptor of a K-major tile in the 128-byte swizzle layout: rows of 128 bytes,
// 8-row atoms of 1024 bytes (stride byte offset), atom base 1024-byte aligned; the start address may
// step by 32 bytes inside an atom to select the k32 slice. Leading byte offset is unused here (1).
__device__ __forceinline__ std::uint64_t sw128_descriptor(const void* smem) {
  const std::uint32_t address = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<std::uint64_t>((address & 0x3ffff) >> 4) | (std::uint64_t{1} << 16) |
         (std::uint64_t{1024 >> 4} << 32) | (std::uint64_t{1} << 62);
}

// The descriptor of the tile `bytes` further on (a multiple of 16 inside the same shared-memory
// window): only the 14-bit start-address field changes, and shared addresses (< 2^18) never carry
// out of it, so a 32-bit add on the low word suffices.
__device__ __forceinline__ std::uint64_t advance_descriptor(std::uint64_t descriptor, int bytes) {
  const std::uint32_t low = static_cast<std::uint32_t>(descriptor) + (static_cast<std::uint32_t>(bytes) >> 4);
  return (descriptor & 0xffffffff00000000ull) | low;
}

// Orders this warpgroup's earlier register and shared-memory accesses before the next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// Keeps the compiler from moving accesses of `r` across the asynchronous wgmma boundaries.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(std::uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

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

// 16-byte load of data read once (keys): no L1 allocation, cached in L2 for other CTAs.
__device__ __forceinline__ uint4 load_stream_v4(const void* address) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(address));
  return v;
}

__device__ __forceinline__ uint2 load_stream_v2(const void* address) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(address));
  return v;
}

__device__ __forceinline__ std::uint32_t load_stream_u32(const void* address) {
  std::uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];\n" : "=r"(v) : "l"(address));
  return v;
}

}  // namespace dsv4::cuda::ptx
