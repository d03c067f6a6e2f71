// dsv4/norms.hpp — RMSNorm and the Walsh–Hadamard transform (SPEC §3), reference precision.
//
// Both accumulate in double and round the result once to float32; the GPU kernels match them
// within the SPEC §9 tolerances, and the bf16 rounding that follows each use in the model hides
// the difference almost always.
#pragma once

namespace dsv4 {

// y = weight ⊙ x / sqrt(mean(x²) + eps), mean in double. `weight` [n] may be null (no weight, as
// for the per-head query norm of SPEC §8). `y` may alias `x`. Throws Error("n") when n ≤ 0,
// Error("eps") when eps < 0 and Error("x") / Error("y") for a null pointer.
void rms_norm(const float* x /*[n]*/, const float* weight /*[n] or null*/, int n, double eps, float* y /*[n]*/);

// In place: x ← H_n x / sqrt(n), H_n in Sylvester order (H_1 = [1], H_2k = [[H_k, H_k], [H_k, −H_k]]),
// i.e. y[i] = Σ_j (−1)^popcount(i & j) x[j] / sqrt(n). Throws Error("n") unless n is a power of two,
// Error("x") for a null pointer.
void walsh_hadamard(float* x /*[n]*/, int n);

}  // namespace dsv4
