#!/usr/bin/env bash
b=build-gpu/bench/bench_sparse_attention
L=$OUT/ab4.txt; exec >>$L 2>&1
for mode in 0 auto; do
  e="DSV4_ATTENTION_CLUSTER_MERGE=$mode"; [[ $mode == auto ]] && e="DSV4_UNSET=1"
  echo "== $e"
  env $e timeout 60 $b /tmp/ab --split 64 decode_B1_H64_N640_nn1 decode_B1_H128_N640_nn1 decode_B32_H64_N640_nn1 | grep -E '^decode|rror'
  env $e timeout 60 $b /tmp/ab decode_B128_H64_N2176_nn1 decode_B32_H128_N2176_nn1 decode_B1_H128_N2176_nn1 | grep -E '^decode|rror'
done
