// bench/bench_topk.cu — exact top-k over score rows on the GPU.
//
// B rows of N candidates each (every entry visible), normal scores; metric: score bytes / time
// against the measured copy bandwidth (one read of the row is the floor). Each case checks its
// selection (indices and slots) against the CPU reference on up to 8 rows.
// Usage: bench_topk <out_dir> [name-part...]   (with name parts: only the cases whose name holds one)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "dsv4/topk.hpp"

namespace {

using namespace dsv4;
using bench::check_cuda;

constexpr int kEntriesPerPage = 64;

// Approximately normal scores (sum of four uniforms, centred), as the indexer's head sums look.
__global__ void fill_scores(float* x, std::int64_t n, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int j = 0; j < 4; ++j)
      s += static_cast<float>(bench::hash32(seed + 4 * static_cast<std::uint64_t>(i) + j) & 0xffffff) / 16777216.0f;
    x[i] = s - 2.0f;
  }
}

std::string case_name(int batch, std::int64_t n, int k) {
  return "topk_b" + std::to_string(batch) + "_n" + std::to_string(n) + "_k" + std::to_string(k);
}

// In a decode step the score kernel has just written the rows, so they (and the kernel's code) sit in
// L2, and the step runs as a CUDA graph. Timed as graph replays back to back without an L2 flush, so
// neither the cold L2 nor the host's launch cost is counted (the figure beside the cold one).
double in_pipeline_us(const std::function<void(cudaStream_t)>& launch) {
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  double us = 0;
  {
    const bench::CapturedGraph graph(stream, launch);
    constexpr int kReplays = 10;
    us = bench::time_us([&](cudaStream_t s) {
      for (int i = 0; i < kReplays; ++i) graph.launch(s);
    }, stream, {3, 20, false}) / kReplays;
  }
  cudaStreamDestroy(stream);
  return us;
}

void run_case(bench::Report& report, int batch, std::int64_t n, int k, double copy_gbs) {
  Tensor scores = Tensor::empty(DType::F32, {batch, n}, Device::CUDA);
  fill_scores<<<4096, 256>>>(scores.data_as<float>(), scores.numel(), 1000 + static_cast<std::uint64_t>(n) * batch);
  std::vector<std::int32_t> qs(static_cast<std::size_t>(batch + 1)), vis(static_cast<std::size_t>(batch),
                                                                        static_cast<std::int32_t>(n));
  std::iota(qs.begin(), qs.end(), 0);
  const int pages = static_cast<int>((n + kEntriesPerPage - 1) / kEntriesPerPage);
  std::vector<std::int32_t> table(static_cast<std::size_t>(batch) * pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937_64(static_cast<std::uint64_t>(n)));
  Tensor d_qs = Tensor::from_host(DType::I32, {batch + 1}, qs.data(), Device::CUDA);
  Tensor d_vis = Tensor::from_host(DType::I32, {batch}, vis.data(), Device::CUDA);
  Tensor d_table = Tensor::from_host(DType::I32, {batch, pages}, table.data(), Device::CUDA);
  Tensor indices = Tensor::empty(DType::I32, {batch, k}, Device::CUDA);
  Tensor slots = Tensor::empty(DType::I32, {batch, k}, Device::CUDA);
  const IndexerRowsView rows{d_qs.view(), d_vis.view(), d_table.view()};
  indices.fill_bytes(0xEE);
  indexer_topk(scores.view(), rows, kEntriesPerPage, indices.view(), slots.view());
  check_cuda(cudaDeviceSynchronize(), "topk");

  // Check rows spread over the batch against the reference.
  bool ok = true;
  const int check_rows = std::min(batch, 8);
  for (int i = 0; i < check_rows && ok; ++i) {
    const int row = static_cast<int>(static_cast<std::int64_t>(i) * batch / check_rows);
    std::vector<float> h_scores(static_cast<std::size_t>(n));
    check_cuda(cudaMemcpy(h_scores.data(), scores.data_as<float>() + row * n, n * sizeof(float), cudaMemcpyDeviceToHost),
               "scores");
    std::vector<std::int32_t> one_qs = {0, 1}, one_vis = {static_cast<std::int32_t>(n)};
    std::vector<std::int32_t> one_table(table.begin() + static_cast<std::int64_t>(row) * pages,
                                        table.begin() + static_cast<std::int64_t>(row + 1) * pages);
    std::vector<std::int32_t> want(static_cast<std::size_t>(k)), want_slots(want.size()), got(want.size()),
        got_slots(want.size());
    indexer_topk(TensorView{h_scores.data(), DType::F32, {1, n}, Device::CPU},
                 {TensorView{one_qs.data(), DType::I32, {2}, Device::CPU},
                  TensorView{one_vis.data(), DType::I32, {1}, Device::CPU},
                  TensorView{one_table.data(), DType::I32, {1, pages}, Device::CPU}},
                 kEntriesPerPage, TensorView{want.data(), DType::I32, {1, k}, Device::CPU},
                 TensorView{want_slots.data(), DType::I32, {1, k}, Device::CPU});
    check_cuda(cudaMemcpy(got.data(), indices.data_as<std::int32_t>() + static_cast<std::int64_t>(row) * k,
                          k * sizeof(std::int32_t), cudaMemcpyDeviceToHost), "indices");
    check_cuda(cudaMemcpy(got_slots.data(), slots.data_as<std::int32_t>() + static_cast<std::int64_t>(row) * k,
                          k * sizeof(std::int32_t), cudaMemcpyDeviceToHost), "slots");
    ok = got == want && got_slots == want_slots;
  }
  IndexerOptions fast;
  fast.check_contents = false;
  const auto launch = [&](cudaStream_t s) {
    fast.stream = s;
    indexer_topk(scores.view(), rows, kEntriesPerPage, indices.view(), slots.view(), fast);
  };
  const double bytes = 4.0 * batch * n;
  const auto add = [&](const std::string& name, double us) {
    report.add(name, {{"batch", batch}, {"candidates", n}, {"k", k}}, us, "GB/s", bytes / (us * 1e-6) / 1e9, copy_gbs,
               ok);
  };
  add(case_name(batch, n, k), bench::time_us(launch, nullptr, {3, 30, true}));
  if (batch == 1) add(case_name(batch, n, k) + "_l2warm", in_pipeline_us(launch));
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<bench::Session> session = bench::start_session("bench_topk", argc, argv);
  if (!session) return 2;
  auto& [report, filter, copy_gbs] = *session;
  const auto run = [&](int batch, std::int64_t n, int k) {
    const std::string name = case_name(batch, n, k);
    if (filter.wants(name)) run_case(report, batch, n, k, copy_gbs);
  };
  for (int batch : {1, 32, 128})
    for (std::int64_t n : {16384, 65536, 262144}) run(batch, n, 512);
  for (int k : {1024, 2048}) {
    run(1, 262144, k);
    run(128, 65536, k);
  }
  report.write();
  return 0;
}
