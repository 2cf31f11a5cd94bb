// Float64 reference of the sampling controls (flashspec.h, "Sampling
// controls"): bias, mask, temperature, top-k, top-p, min-p, renormalise;
// plus deliberately wrong variants that the exactness tests must reject.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

namespace fstest {

struct ReferenceControls {
  int top_k = INT_MAX;
  double top_p = 1.0;
  double min_p = 0.0;
  std::vector<std::pair<int, float>> bias;  // (token, additive bias); repeats add up
  double repetition = 1.0;                  // repetition penalty of the bias tokens
  std::vector<bool> allowed;                // empty: every token allowed
};

enum class FilterBug {
  kNone,
  kTopPBeforeTemperature,  // top-p's nucleus chosen on softmax(l + bias), T applied after
  kMinPUnmaskedMax,        // min-p relative to the max over every token, masked ones too
  kBiasAfterTemperature,   // x = l / T + bias
  kNoControls,             // p = softmax(l / T): every control ignored
  kRepetitionAfterBias,    // the repetition penalty applied to l + bias instead of l
};

inline const char* filter_bug_name(FilterBug bug) {
  switch (bug) {
    case FilterBug::kNone: return "correct";
    case FilterBug::kTopPBeforeTemperature: return "top-p-before-temperature";
    case FilterBug::kMinPUnmaskedMax: return "min-p-unmasked-max";
    case FilterBug::kBiasAfterTemperature: return "bias-after-temperature";
    case FilterBug::kNoControls: return "no-controls";
    case FilterBug::kRepetitionAfterBias: return "repetition-after-bias";
  }
  return "?";
}

// The controlled distribution p of logits l at temperature T > 0, or (T = 0)
// the point mass on the argmax of l + bias over the allowed tokens.
inline std::vector<double> controlled(const std::vector<double>& l, double temperature, const ReferenceControls& c,
                                      FilterBug bug = FilterBug::kNone) {
  const size_t V = l.size();
  if (bug == FilterBug::kNoControls) return controlled(l, temperature, ReferenceControls{});
  std::vector<double> biased = l;
  const double bias_scale = bug == FilterBug::kBiasAfterTemperature ? temperature : 1.0;
  auto penalise = [&c](double v) { return v > 0.0 ? v / c.repetition : v * c.repetition; };
  std::vector<bool> named(V, false);
  for (const auto& entry : c.bias) named[size_t(entry.first)] = true;
  if (bug != FilterBug::kRepetitionAfterBias)
    for (size_t i = 0; i < V; ++i)
      if (named[i]) biased[i] = penalise(biased[i]);
  for (const auto& [token, value] : c.bias) biased[size_t(token)] += double(value) * bias_scale;
  if (bug == FilterBug::kRepetitionAfterBias)
    for (size_t i = 0; i < V; ++i)
      if (named[i]) biased[i] = penalise(biased[i]);
  auto allowed = [&](size_t i) { return c.allowed.empty() || c.allowed[i]; };
  std::vector<double> p(V, 0.0);
  if (temperature == 0.0) {
    size_t best = V;
    for (size_t i = 0; i < V; ++i)
      if (allowed(i) && (best == V || biased[i] > biased[best])) best = i;
    p[best] = 1.0;
    return p;
  }
  std::vector<double> x(V, -INFINITY);
  std::vector<int> ranked;
  for (size_t i = 0; i < V; ++i)
    if (allowed(i)) {
      x[i] = biased[i] / temperature;
      ranked.push_back(int(i));
    }
  auto by_rank = [](const std::vector<double>& v) {
    return [&v](int a, int b) { return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b); };
  };
  std::sort(ranked.begin(), ranked.end(), by_rank(x));
  size_t n = ranked.size();
  {
    const size_t k = std::min(n, size_t(std::max(c.top_k, 1)));
    // Top-p on the kept top-k tokens, by the distribution after T (or, for
    // the bug, before it).
    const std::vector<double>& basis = bug == FilterBug::kTopPBeforeTemperature ? biased : x;
    std::vector<int> top(ranked.begin(), ranked.begin() + long(k));
    std::sort(top.begin(), top.end(), by_rank(basis));
    const double b0 = basis[size_t(top[0])];
    double mass = 0.0;
    for (int t : top) mass += std::exp(basis[size_t(t)] - b0);
    size_t n_p = k;
    double cumulative = 0.0;
    for (size_t i = 0; i < k; ++i) {
      cumulative += std::exp(basis[size_t(top[i])] - b0);
      if (cumulative >= c.top_p * mass) {
        n_p = i + 1;
        break;
      }
    }
    std::vector<int> nucleus(top.begin(), top.begin() + long(n_p));
    std::sort(nucleus.begin(), nucleus.end(), by_rank(x));
    double max_x = x[size_t(nucleus[0])];
    if (bug == FilterBug::kMinPUnmaskedMax) {
      max_x = -INFINITY;
      for (size_t i = 0; i < V; ++i) max_x = std::max(max_x, biased[i] / temperature);
    }
    size_t n_m = 0;
    for (int t : nucleus)
      if (std::exp(x[size_t(t)] - max_x) >= c.min_p) ++n_m;
    n = n_m;
    ranked.assign(nucleus.begin(), nucleus.begin() + long(n_m));
  }
  if (ranked.empty()) return p;  // only a wrong variant can get here
  const double x0 = x[size_t(ranked[0])];
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += (p[size_t(ranked[i])] = std::exp(x[size_t(ranked[i])] - x0));
  for (double& v : p) v /= sum;
  return p;
}

// log softmax of the raw logits.
inline std::vector<double> raw_log_softmax(const std::vector<double>& l) {
  const double m = *std::max_element(l.begin(), l.end());
  double sum = 0.0;
  for (double v : l) sum += std::exp(v - m);
  std::vector<double> out(l.size());
  for (size_t i = 0; i < l.size(); ++i) out[i] = l[i] - m - std::log(sum);
  return out;
}

}  // namespace fstest
