// SPDX-License-Identifier: Apache-2.0
/// The `compile` suite's report: every public header compiled on its own (one generated translation unit
/// each, linked into this program) with g++, and in CUDA builds all of them in one nvcc unit. Building is the check; this
/// program prints what was covered and fails if the list is empty.
#include <cstdio>

extern char const* const kSelfContainedHeaders[];
extern int const kNumSelfContainedHeaders;

int main() {
  for (int i = 0; i < kNumSelfContainedHeaders; ++i) std::printf("self-contained: %s\n", kSelfContainedHeaders[i]);
  std::printf("%d headers compiled standalone\n", kNumSelfContainedHeaders);
  return kNumSelfContainedHeaders > 0 ? 0 : 1;
}
