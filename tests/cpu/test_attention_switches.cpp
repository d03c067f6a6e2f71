// tests/cpu/test_attention_switches.cpp — the sparse attention's kernel-variant switches
// (DSV4_ATTENTION_ASYMMETRIC, DSV4_ATTENTION_PAIR_DECODE, DSV4_ATTENTION_CLUSTER_MERGE): host code
// of the CUDA backend, checked without a GPU. ctest runs each test in its own process, and a valid
// value is read once per process, so each test sets its variable before the first read.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "testing/testing.hpp"
#if DSV4_WITH_CUDA
#include "cuda/sparse_attention/params.hpp"
#endif

namespace dsv4 {
namespace {

#if DSV4_WITH_CUDA

using testing::expect_error;

TEST(AttentionSwitches, PairDecodeIsValidatedAndReadOnce) {
  constexpr const char* kVariable = "DSV4_ATTENTION_PAIR_DECODE";
  ASSERT_EQ(setenv(kVariable, "yes", 1), 0);
  expect_error(kVariable, [] { cuda::pair_decode(); });
  expect_error(kVariable, [] { cuda::pair_decode(); });  // an invalid value is not kept
  ASSERT_EQ(setenv(kVariable, "0", 1), 0);
  EXPECT_FALSE(cuda::pair_decode());
  ASSERT_EQ(setenv(kVariable, "1", 1), 0);
  EXPECT_FALSE(cuda::pair_decode()) << "a valid value is read once per process";
  EXPECT_FALSE(cuda::set_pair_decode(true)) << "set_ returns the setting before the call";
  EXPECT_TRUE(cuda::pair_decode());
  EXPECT_TRUE(cuda::set_pair_decode(false));
  EXPECT_FALSE(cuda::pair_decode());
}

TEST(AttentionSwitches, PairDecodeDefaultsToOn) {
  ASSERT_EQ(unsetenv("DSV4_ATTENTION_PAIR_DECODE"), 0);
  EXPECT_TRUE(cuda::pair_decode());
}

TEST(AttentionSwitches, AsymmetricConsumersDefaultToOnAndValidate) {
  constexpr const char* kVariable = "DSV4_ATTENTION_ASYMMETRIC";
  ASSERT_EQ(setenv(kVariable, "on", 1), 0);
  expect_error(kVariable, [] { cuda::asymmetric_consumers(); });
  ASSERT_EQ(unsetenv(kVariable), 0);
  EXPECT_TRUE(cuda::asymmetric_consumers());
  EXPECT_TRUE(cuda::set_asymmetric_consumers(false));
  EXPECT_FALSE(cuda::asymmetric_consumers());
}

TEST(AttentionSwitches, AsymmetricConsumersOffFromTheEnvironment) {
  ASSERT_EQ(setenv("DSV4_ATTENTION_ASYMMETRIC", "0", 1), 0);
  EXPECT_FALSE(cuda::asymmetric_consumers());
}

TEST(AttentionSwitches, ClusterMergeModesAndValidation) {
  constexpr const char* kVariable = "DSV4_ATTENTION_CLUSTER_MERGE";
  ASSERT_EQ(setenv(kVariable, "2", 1), 0);
  expect_error(kVariable, [] { cuda::cluster_merge(); });
  ASSERT_EQ(setenv(kVariable, "1", 1), 0);
  EXPECT_EQ(cuda::cluster_merge(), cuda::ClusterMerge::forced);
  EXPECT_EQ(cuda::set_cluster_merge(cuda::ClusterMerge::off), cuda::ClusterMerge::forced);
  EXPECT_EQ(cuda::cluster_merge(), cuda::ClusterMerge::off);
}

TEST(AttentionSwitches, ClusterMergeIsAutomaticByDefault) {
  ASSERT_EQ(unsetenv("DSV4_ATTENTION_CLUSTER_MERGE"), 0);
  EXPECT_EQ(cuda::cluster_merge(), cuda::ClusterMerge::automatic);
}

#else

TEST(AttentionSwitches, NeedTheCudaBackend) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif

}  // namespace
}  // namespace dsv4
