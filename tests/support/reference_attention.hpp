// The tests' oracle for the attention cores: causal multi-head attention computed plainly in
// double, score by score, from the rows of q | k | v that the cores take.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

// softmax(q k^T / sqrt(head width), causal) v for each sequence and head, in double: qkv holds
// batch * seq rows of 3 * w values (q, k and v, each w = heads * head width wide); the result is
// batch * seq rows of w values, the heads side by side.
template <class T>
std::vector<double> reference_causal_attention(T const* qkv, std::size_t batch, std::size_t seq, std::size_t w,
                                               std::size_t heads) {
  std::size_t const hd = w / heads;
  std::vector<double> out(batch * seq * w);
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t head = 0; head < heads; ++head)
      for (std::size_t t = 0; t < seq; ++t) {
        auto at = [&](std::size_t row, std::size_t part, std::size_t c) {
          return double(qkv[(b * seq + row) * 3 * w + part * w + head * hd + c]);
        };
        std::vector<double> sc(t + 1);
        double mx = -1e300;
        for (std::size_t j = 0; j <= t; ++j) {
          double d = 0;
          for (std::size_t c = 0; c < hd; ++c) d += at(t, 0, c) * at(j, 1, c);
          sc[j] = d / std::sqrt(double(hd));
          mx = std::max(mx, sc[j]);
        }
        double z = 0;
        for (double& v : sc) z += v = std::exp(v - mx);
        for (std::size_t c = 0; c < hd; ++c) {
          double want = 0;
          for (std::size_t j = 0; j <= t; ++j) want += sc[j] / z * at(j, 2, c);
          out[(b * seq + t) * w + head * hd + c] = want;
        }
      }
  return out;
}
