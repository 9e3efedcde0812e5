// A streaming read at full speed (four independent sums), the benchmark's measure of the machine's
// read bandwidth with the same instruction set the kernels use. Not part of any op.
#pragma once

#include "canonical.h"

namespace quest::QUEST_ISA {

inline float read_probe(const float* data, int64_t count) {
  Lanes a = Lanes::zero(), b = a, c = a, d = a;
  int64_t i = 0;
  for (; i + 4 * kChunk <= count; i += 4 * kChunk) {
    a = a + Lanes::load(data + i);
    b = b + Lanes::load(data + i + kChunk);
    c = c + Lanes::load(data + i + 2 * kChunk);
    d = d + Lanes::load(data + i + 3 * kChunk);
  }
  float rest = 0.0f;
  for (; i < count; ++i) rest += data[i];
  return ((a + b) + (c + d)).fold() + rest;
}

}  // namespace quest::QUEST_ISA
