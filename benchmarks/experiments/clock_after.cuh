// A clock read for the microbenchmarks in this directory.
#pragma once

#include <cstdint>

// clock64 read after `dependency` is available: the value feeds the read's predicate, so ptxas cannot
// hoist the read above the work that produced it (checked in the SASS).
__device__ __forceinline__ unsigned long long clock_after(uint32_t dependency) {
  unsigned long long t;
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.u32 p, %1, 0x7fc00001;\nmov.u64 %0, 0;\n@p mov.u64 %0, %%clock64;\n}\n"
      : "=l"(t)
      : "r"(dependency)
      : "memory");
  return t;
}
