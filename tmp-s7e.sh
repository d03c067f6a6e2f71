#!/usr/bin/env bash
export PATH=/usr/local/cuda/bin:$PATH
exec >>$OUT/run.txt 2>&1
cfg="-G Ninja -DDSV4_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release"
(cmake -S . -B /tmp/bn $cfg >/dev/null && cmake --build /tmp/bn -j8 --target bench_sparse_attention 2>&1 | tail -1) &
(cmake -S . -B /tmp/btl $cfg -DCMAKE_CUDA_FLAGS=-DDSV4_ATTENTION_TIMELINE=1 >/dev/null && cmake --build /tmp/btl -j8 --target bench_sparse_attention 2>&1 | tail -1) &
wait
C="decode_B1_H64_N640_nn1 decode_B32_H64_N640_nn1 decode_B128_H64_N640_nn1 decode_B128_H64_N1152_nn1 decode_B128_H128_N1152_nn1 prefill_T4096_H64_N640"
for r in 1 2; do for a in 1 0; do echo "== ASYM=$a run $r"; DSV4_ATTENTION_ASYMMETRIC=$a timeout 100 /tmp/bn/bench/bench_sparse_attention /tmp/o $C 2>&1 | grep -E "^(decode|prefill)|rror" | grep -v "split"; done; done
for c in decode_B128_H64_N640_nn1 decode_B1_H64_N640_nn1; do timeout 60 /tmp/btl/bench/bench_sparse_attention --timeline /tmp/tl-$c.json $c 2>&1 | head -40; done
