// Goodness-of-fit statistics for the exactness tests: Pearson's chi-square
// (cells with small expectation pooled) and the Kolmogorov–Smirnov distance
// of a discrete token CDF.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <cstdio>
#include <string>
#include <vector>

namespace fstest {

// Regularised upper incomplete gamma Q(a, x) (series / continued fraction).
inline double gamma_q(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double gln = std::lgamma(a);
  if (x < a + 1.0) {
    double ap = a, sum = 1.0 / a, del = sum;
    for (int n = 0; n < 100000; ++n) {
      ap += 1.0;
      del *= x / ap;
      sum += del;
      if (std::fabs(del) < std::fabs(sum) * 1e-15) break;
    }
    return 1.0 - sum * std::exp(-x + a * std::log(x) - gln);
  }
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 100000; ++i) {
    double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    double del = d * c;
    h *= del;
    if (std::fabs(del - 1.0) < 1e-15) break;
  }
  return std::exp(-x + a * std::log(x) - gln) * h;
}

struct ChiSquare {
  double statistic = 0.0;
  int degrees_of_freedom = 0;
  double p_value = 1.0;
};

// counts[i] observed, probabilities[i] expected (summing to 1). Cells whose
// expected count is below min_expected are pooled into one cell, so the
// chi-square approximation holds on any vocabulary.
inline ChiSquare chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probabilities,
                            double min_expected = 5.0) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  ChiSquare result;
  double pooled_observed = 0.0, pooled_expected = 0.0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    double expected = probabilities[i] * double(n);
    if (expected < min_expected) {
      pooled_observed += double(counts[i]);
      pooled_expected += expected;
      continue;
    }
    double diff = double(counts[i]) - expected;
    result.statistic += diff * diff / expected;
    ++cells;
  }
  if (pooled_expected > 0.0) {
    if (pooled_expected >= 1e-12) {
      double diff = pooled_observed - pooled_expected;
      result.statistic += diff * diff / std::max(pooled_expected, 1e-12);
      ++cells;
    } else if (pooled_observed > 0.0) {
      result.statistic = std::numeric_limits<double>::infinity();  // mass where none is possible
    }
  }
  result.degrees_of_freedom = std::max(cells - 1, 1);
  result.p_value = std::isinf(result.statistic) ? 0.0 : gamma_q(0.5 * result.degrees_of_freedom, 0.5 * result.statistic);
  return result;
}

struct KolmogorovSmirnov {
  double distance = 0.0;  // sup over tokens of |F_empirical − F|
  double p_value = 1.0;   // asymptotic Kolmogorov; conservative for a discrete CDF
};

inline KolmogorovSmirnov kolmogorov_smirnov(const std::vector<int64_t>& counts, const std::vector<double>& probabilities) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  KolmogorovSmirnov result;
  double empirical = 0.0, expected = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    empirical += double(counts[i]) / double(n);
    expected += probabilities[i];
    result.distance = std::max(result.distance, std::fabs(empirical - expected));
  }
  double lambda = (std::sqrt(double(n)) + 0.12 + 0.11 / std::sqrt(double(n))) * result.distance;
  double sum = 0.0;
  for (int k = 1; k < 200; ++k) sum += 2.0 * ((k % 2) ? 1.0 : -1.0) * std::exp(-2.0 * k * k * lambda * lambda);
  result.p_value = lambda < 0.2 ? 1.0 : std::clamp(sum, 0.0, 1.0);
  return result;
}

// All chi-square and KS p-values of one sampler in one configuration. The
// family is judged at kFamilyAlpha with a Bonferroni correction, so adding
// statistics never makes a correct sampler likelier to fail.
constexpr double kFamilyAlpha = 0.001;

struct Verdict {
  double min_p_value = 1.0;
  int tests = 0;
  std::string detail;
  bool rejects() const { return min_p_value < kFamilyAlpha / std::max(tests, 1); }
  void add(const std::string& what, const std::vector<int64_t>& counts, const std::vector<double>& expected) {
    int64_t n = 0;
    for (int64_t c : counts) n += c;
    if (n == 0) return;
    auto chi = chi_square(counts, expected);
    auto ks = kolmogorov_smirnov(counts, expected);
    min_p_value = std::min({min_p_value, chi.p_value, ks.p_value});
    tests += 2;
    char line[256];
    std::snprintf(line, sizeof line, "  %-22s n=%-7lld chi2=%9.2f df=%-4d p=%.3g  KS D=%.4f p=%.3g\n", what.c_str(),
                  (long long)n, chi.statistic, chi.degrees_of_freedom, chi.p_value, ks.distance, ks.p_value);
    detail += line;
  }
};

}  // namespace fstest
