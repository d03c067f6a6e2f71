// src/cuda/sparse_attention/ptx.cuh — the sm_80+/sm_90 instructions the sparse attention kernels use.
//
// Thin wrappers, one instruction each, so kernel bodies read as data flow.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/ptx_sm90.cuh"

namespace dsv4::cuda::ptx {

__device__ __forceinline__ std::uint32_t smem_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global → shared, bypassing L1; `valid == false` writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem_dst)), "l"(gmem_src),
               "r"(valid ? 16 : 0)
               : "memory");
}
// 8 bytes global → shared (the .cg variant only moves 16); zero-fills when `valid == false`.
__device__ __forceinline__ void cp_async_8(void* smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_address(smem_dst)), "l"(gmem_src),
               "r"(valid ? 8 : 0)
               : "memory");
}
// (cp_async_commit / cp_async_wait_all: cuda/common/ptx_sm90.cuh.)

// An mbarrier in shared memory as a hand-over between warpgroups. (Plain loads and stores ordered
// only by bar.arrive -> bar.sync are reported as races by compute-sanitizer's racecheck; mbarrier
// arrive -> wait it follows: notes-sparse-attention.md §20.)
__device__ __forceinline__ void mbarrier_init(std::uint64_t* barrier, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(barrier)), "r"(arrivals) : "memory");
}
// Release at CTA scope: this thread's earlier shared-memory accesses are visible to the waiters.
__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* barrier) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_address(barrier))
               : "memory");
}
// Acquire: returns once the phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* barrier, std::uint32_t parity) {
  asm volatile("{\n.reg .pred done;\nwait:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra wait;\n}\n" ::"r"(smem_address(barrier)),
               "r"(parity)
               : "memory");
}

// ---- the 2-CTA cluster decode (wgmma_kernel.cuh, kPairDecode): the peer's shared memory -------------
// Addresses are 32-bit shared-window addresses: smem_address gives this CTA's (shared::cta);
// map_to_rank the shared::cluster address of the same byte in CTA `rank` of the cluster.
__device__ __forceinline__ std::uint32_t cluster_rank() {
  std::uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
__device__ __forceinline__ std::uint32_t map_to_rank(std::uint32_t address, std::uint32_t rank) {
  std::uint32_t mapped;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(mapped) : "r"(address), "r"(rank));
  return mapped;
}
// Orders this thread's mbarrier initializations before its next cluster barrier arrival (the peer
// arrives on them).
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// The cluster barrier, split: every thread of the cluster arrives, a waiting thread goes on once all
// have. arrive releases the thread's earlier accesses (distributed shared memory included) to the
// waiters' acquire; arrive_relaxed orders nothing (after fence_mbarrier_init_cluster, which does).
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }
// One arrival on the mbarrier at shared::cluster address `barrier` (this CTA's or the peer's).
__device__ __forceinline__ void mbarrier_arrive_cluster(std::uint32_t barrier) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(barrier) : "memory");
}
// One arrival that also announces `bytes` of copies the phase must see land first.
__device__ __forceinline__ void mbarrier_arrive_expect_tx_cluster(std::uint32_t barrier, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cluster.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
}
// The copy engine moves `bytes` (a multiple of 16, both addresses 16-byte aligned) from this CTA's
// shared memory (`source`, shared::cta) to a CTA of the cluster (`destination`, shared::cluster);
// once landed they complete that many bytes of transactions on that CTA's mbarrier `barrier`.
__device__ __forceinline__ void bulk_copy_to_peer(std::uint32_t destination, std::uint32_t source, std::uint32_t bytes,
                                                  std::uint32_t barrier) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   destination),
               "r"(source), "r"(bytes), "r"(barrier)
               : "memory");
}

// Four 8×8 b16 matrices; lanes 8i..8i+7 give the shared-memory addresses of the rows of matrix i,
// register i receives it.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row));
}
// The same, each matrix transposed on the way (for the MN-major operand).
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row));
}

// D(16×8, f32) += A(16×16, bf16, row) · B(16×8, bf16, col).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                               std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x (MUFU.EX2; results below 2^-126 flush to zero, which no bf16 probability here can tell apart).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats → bf16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}
// bf16x2 · bf16x2, round to nearest even (exact for a power-of-two factor without over/underflow).
__device__ __forceinline__ std::uint32_t mul_bf16x2(std::uint32_t a, std::uint32_t b) {
  const __nv_bfloat162 r =
      __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const std::uint32_t*>(&r);
}


// D[64×128] (+)= A[64×16] · B[16×128]: as wgmma_m64n256k16_bf16_rs_bt (common/ptx_sm90.cuh) for a
// narrower slice of output dims (the dim-split launch of the wgmma kernel).
__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs_bt(float (&d)[64], std::uint32_t a0, std::uint32_t a1,
                                                           std::uint32_t a2, std::uint32_t a3,
                                                           std::uint64_t descriptor_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(descriptor_b), "r"(static_cast<int>(accumulate)));
}

// D[64×64] (+)= A[64×16] · B[16×64]: as wgmma_m64n256k16_bf16_rs_bt (common/ptx_sm90.cuh) for a
// narrower slice of output dims (the dim-split launch of the wgmma kernel).
__device__ __forceinline__ void wgmma_m64n64k16_bf16_rs_bt(float (&d)[32], std::uint32_t a0, std::uint32_t a1,
                                                           std::uint32_t a2, std::uint32_t a3,
                                                           std::uint64_t descriptor_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(descriptor_b), "r"(static_cast<int>(accumulate)));
}

}  // namespace dsv4::cuda::ptx
