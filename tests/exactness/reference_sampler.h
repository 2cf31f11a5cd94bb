// A float64 implementation of Algorithm 1 (Leviathan et al. 2023) from exact
// distributions, with switchable, deliberately wrong variants. The exactness
// tests run the library against the exact target, then run each wrong variant
// through the same statistics to show that the tests can tell.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace fstest {

enum class Bug {
  kNone,
  kResampleFromP,    // after a rejection sample p instead of norm(max(p − q, 0))
  kAcceptOffByOne,   // score draft j with the next row's p
  kInvertedRatio,    // accept with min(1, q/p) instead of min(1, p/q)
  kBonusFromWrongRow // draw the bonus token from row n − 1 instead of row n
};

inline const char* bug_name(Bug bug) {
  switch (bug) {
    case Bug::kNone: return "correct";
    case Bug::kResampleFromP: return "resample-from-p";
    case Bug::kAcceptOffByOne: return "accept-off-by-one";
    case Bug::kInvertedRatio: return "inverted-ratio";
    case Bug::kBonusFromWrongRow: return "bonus-from-wrong-row";
  }
  return "?";
}

using Distribution = std::vector<double>;

// p_i ∝ exp(logits_i / T), in float64.
inline Distribution softmax(const std::vector<double>& logits, double temperature) {
  Distribution p(logits.size());
  double m = -INFINITY;
  for (double l : logits) m = std::max(m, l / temperature);
  double sum = 0.0;
  for (size_t i = 0; i < p.size(); ++i) sum += (p[i] = std::exp(logits[i] / temperature - m));
  for (double& x : p) x /= sum;
  return p;
}

inline int sample(const Distribution& p, std::mt19937_64& rng) {
  double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  double cumulative = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    cumulative += p[i];
    if (u < cumulative) return int(i);
  }
  for (size_t i = p.size(); i-- > 0;)
    if (p[i] > 0.0) return int(i);
  return 0;
}

inline Distribution point_mass(int token, size_t vocab) {
  Distribution q(vocab, 0.0);
  q[size_t(token)] = 1.0;
  return q;
}

// One request: target rows p[0..n], draft distributions q[0..n−1] (a point
// mass for greedy drafts), drafted tokens x[0..n−1]. Returns the emitted
// tokens (accepted drafts, then the recovered or bonus token).
inline std::vector<int> algorithm1(const std::vector<Distribution>& p, const std::vector<Distribution>& q,
                                   const std::vector<int>& x, Bug bug, std::mt19937_64& rng) {
  const size_t n = x.size();
  std::vector<int> emitted;
  for (size_t j = 0; j < n; ++j) {
    const Distribution& scoring = (bug == Bug::kAcceptOffByOne) ? p[j + 1] : p[j];
    const double pj = scoring[size_t(x[j])], qj = q[j][size_t(x[j])];
    const double ratio = (bug == Bug::kInvertedRatio) ? qj / pj : pj / qj;
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    if (u < std::min(1.0, ratio)) {
      emitted.push_back(x[j]);
      continue;
    }
    if (bug == Bug::kResampleFromP) {
      emitted.push_back(sample(p[j], rng));
      return emitted;
    }
    Distribution residual(p[j].size());
    double mass = 0.0;
    for (size_t i = 0; i < residual.size(); ++i) {
      residual[i] = std::max(p[j][i] - q[j][i], 0.0);
      mass += residual[i];
    }
    for (double& r : residual) r /= mass;
    emitted.push_back(sample(residual, rng));
    return emitted;
  }
  const Distribution& bonus = (bug == Bug::kBonusFromWrongRow && n > 0) ? p[n - 1] : p[n];
  emitted.push_back(sample(bonus, rng));
  return emitted;
}

}  // namespace fstest
