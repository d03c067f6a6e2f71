// src/cuda/common/ptx_sm90.cuh — Hopper (sm_90a) PTX shared by the kernel families: warpgroup MMA
// plumbing, shared-memory matrix descriptors, streaming global loads, cp.async copies and groups, byte
// permutation.
// One instruction per wrapper.
#pragma once

#include <cstdint>

namespace dsv4::cuda::ptx {

// ---- cp.async (each thread's own copies) ---------------------------------------------------------------

// 16 bytes global (16-byte aligned) → `shared`, asynchronously, through L2 only (.cg: data read once).
__device__ __forceinline__ void cp_async_cg16(void* shared, const void* global) {
  const auto address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global) : "memory");
}

// An L2 policy that marks the lines an access brings in as the first to evict: data read once, so
// that streaming it does not push out what other accesses will read again.
__device__ __forceinline__ std::uint64_t evict_first_policy() {
  std::uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));  // not volatile: may be merged or hoisted
  return policy;
}

// cp_async_cg16 with an L2 cache policy (evict_first_policy).
__device__ __forceinline__ void cp_async_cg16(void* shared, const void* global, std::uint64_t policy) {
  const auto address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global), "l"(policy)
               : "memory");
}

// Programmatic dependent launch. allow_dependent_launch: a kernel launched after this one with the
// programmatic-serialization attribute may start (its blocks take free SMs) once every block of this
// grid has executed it. wait_for_prerequisite_grids: blocks here until the grids this one was launched
// after have completed and their memory is visible (returns at once without that attribute) — so a
// kernel that may be launched early executes it before its first read of another kernel's output.
__device__ __forceinline__ void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void wait_for_prerequisite_grids() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// Both, as the first statement of a kernel launched early that has nothing to do before the wait.
__device__ __forceinline__ void start_after_prerequisite_grids() {
  allow_dependent_launch();
  wait_for_prerequisite_grids();
}

// Closes the group of this thread's cp.async copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are in flight; the completed copies
// are then visible to this thread.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }
// cp_async_wait for a count that becomes a constant only once an unrolled loop is (0 ≤ pending < 8):
// the switch folds to the one wait instruction.
__device__ __forceinline__ void cp_async_wait_pending(int pending) {
  switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
  }
}

// ---- byte permutation -------------------------------------------------------------------------------------

// prmt.b32 with PTX's default-mode selector as is (CUDA's __byte_perm masks each selector nibble to
// 3 bits first): nibble n of selector[15:0] picks byte n of the result from the 8 bytes {b, a}
// (a = bytes 0–3) by its bits 0–2; with its bit 3 set the result byte is that byte's msb replicated.
__device__ __forceinline__ std::uint32_t prmt(std::uint32_t a, std::uint32_t b, std::uint32_t selector) {
  std::uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}

// ---- shared-memory matrix descriptors (128-byte swizzle) -------------------------------------------
// A swizzled tile is made of 8-row × 128-byte atoms (1024 bytes, 1024-byte aligned); inside an atom,
// 16-byte group c of row r sits at position c ^ (r mod 8). The start address may step by 32-byte
// multiples inside an atom to select a K slice.

inline constexpr std::uint32_t kSwizzleAtomBytes = 1024;

// Descriptor with explicit leading / stride byte offsets (multiples of 16).
__device__ __forceinline__ std::uint64_t sw128_descriptor(const void* smem, std::uint32_t leading_bytes,
                                                          std::uint32_t stride_bytes) {
  const std::uint32_t address = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<std::uint64_t>((address & 0x3ffff) >> 4) | (static_cast<std::uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<std::uint64_t>(stride_bytes >> 4) << 32) | (std::uint64_t{1} << 62);
}

// K-major tile: rows of 128 bytes of K, 8-row atoms one after another (stride 1024); the K extent of
// one instruction fits in the 128-byte row, so the leading byte offset is unused (1).
__device__ __forceinline__ std::uint64_t sw128_descriptor(const void* smem) {
  return sw128_descriptor(smem, 16, kSwizzleAtomBytes);
}

// The descriptor of the tile `bytes` further on (a multiple of 16 inside the same shared-memory
// window): only the 14-bit start-address field changes, and shared addresses (< 2^18) never carry
// out of it, so a 32-bit add on the low word suffices.
__device__ __forceinline__ std::uint64_t advance_descriptor(std::uint64_t descriptor, int bytes) {
  const std::uint32_t low = static_cast<std::uint32_t>(descriptor) + (static_cast<std::uint32_t>(bytes) >> 4);
  return (descriptor & 0xffffffff00000000ull) | low;
}

// Generic-proxy writes to shared memory (st.shared, cp.async) → visible to the tensor cores' async
// proxy. Every writing thread runs it before the barrier that hands the tile to wgmma.
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- wgmma bookkeeping -------------------------------------------------------------------------------

// Orders this warpgroup's earlier register and shared-memory accesses before the next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// Keeps the compiler from moving accesses of `r` across the asynchronous wgmma boundaries.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(std::uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// ---- bf16 warpgroup MMA ------------------------------------------------------------------------------

// D[64×32] (+)= A[64×16] · B[16×32], bf16 → f32, both operands K-major in shared memory (descriptors).
// d[4j+i]: row 16w + g + 8·(i/2), column 8j + 2q + i%2 (warp w of the warpgroup, lane = 4g + q).
__device__ __forceinline__ void wgmma_m64n32k16_bf16_ss(float (&d)[16], std::uint64_t descriptor_a,
                                                       std::uint64_t descriptor_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(descriptor_a), "l"(descriptor_b), "r"(static_cast<int>(accumulate)));
}

// D[64×64] (+)= A[64×16] · B[16×64], bf16 → f32, both operands K-major in shared memory (descriptors).
// d[4j+i]: row 16w + g + 8·(i/2), column 8j + 2q + i%2 (warp w of the warpgroup, lane = 4g + q).
__device__ __forceinline__ void wgmma_m64n64k16_bf16_ss(float (&d)[32], std::uint64_t descriptor_a,
                                                       std::uint64_t descriptor_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(descriptor_a), "l"(descriptor_b), "r"(static_cast<int>(accumulate)));
}

// D[64×256] (+)= A[64×16] · B[16×256], bf16 → f32; A from registers (warp w, lane 4g + q:
// a0 = A[16w+g][2q, 2q+1], a1 = A[16w+g+8][2q, 2q+1], a2 = A[16w+g][8+2q, 9+2q], a3 = A[16w+g+8][8+2q, 9+2q]),
// B N-major ("transposed": per k, N contiguous) in shared memory. d[4j+i]: row 16w + g + 8·(i/2),
// column 8j + 2q + i%2.
__device__ __forceinline__ void wgmma_m64n256k16_bf16_rs_bt(float (&d)[128], std::uint32_t a0, std::uint32_t a1,
                                                           std::uint32_t a2, std::uint32_t a3,
                                                           std::uint64_t descriptor_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(descriptor_b), "r"(static_cast<int>(accumulate)));
}

// ---- named barriers and register reallocation (warp-specialized kernels) ------------------------------

// Waits until `threads` threads (a multiple of 32) have arrived at barrier `id` (1..15; 0 is
// __syncthreads); orders the shared-memory accesses of the participants.
__device__ __forceinline__ void barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at barrier `id` without waiting (the producer side of a hand-over).
__device__ __forceinline__ void barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Per-thread register budget of this warpgroup from here on (multiples of 8, 24..256).
template <int kRegisters>
__device__ __forceinline__ void registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// ---- streaming global loads ----------------------------------------------------------------------------

// 16-byte load of data read once: no L1 allocation, cached in L2 for other CTAs.
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

// Brings a global line into L2 (and its address translation into the TLBs) ahead of a later load.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

__device__ __forceinline__ std::uint32_t load_stream_u32(const void* address) {
  std::uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];\n" : "=r"(v) : "l"(address));
  return v;
}

}  // namespace dsv4::cuda::ptx
