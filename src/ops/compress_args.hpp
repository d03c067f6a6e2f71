// src/ops/compress_args.hpp — the argument block of one compress step, as every backend takes it.
#pragma once

#include "dsv4/compressor.hpp"
#include "ref/compressor_ref.hpp"

namespace dsv4::detail {

// The step's buffers (raw pointers on the pool's device, explicit strides) with its spec and plan,
// for `plan` = plan_compress(spec, weights, batch, kv, score, pool, cache, outputs), which validated
// them; `spec` and `plan` must outlive the result.
ref::CompressArgs compress_args(const CompressorSpec& spec, const CompressPlan& plan, const CompressorWeights& weights,
                                const MatrixF32View& kv, const MatrixF32View& score, CompressorStatePool& pool,
                                PagedCache& cache, const CompressOutputs& outputs = {});

}  // namespace dsv4::detail
