// Metrics: totals, per-position counts, per-arm statistics, latency
// quantiles from the log histogram, reset.
#include <gtest/gtest.h>

#include <cmath>

#include "metrics/metrics.h"

namespace {

using namespace flashspec;

TEST(Metrics, TotalsPositionsAndArms) {
  Metrics m(2);
  m.record(StepRecord{0, 4, 2, 3, 3.0, 1.0, 1e-3});
  m.record(StepRecord{1, 2, 2, 3, 3.0, 1.0, 2e-3});
  m.record(StepRecord{0, 0, 0, 1, 1.0, 1.0, 3e-3});
  MetricsSnapshot s = m.snapshot();
  EXPECT_EQ(s.steps, 3u);
  EXPECT_EQ(s.drafts, 2u);
  EXPECT_EQ(s.draft_tokens, 6u);
  EXPECT_EQ(s.accepted_tokens, 4u);
  EXPECT_EQ(s.emitted_tokens, 7u);
  EXPECT_DOUBLE_EQ(s.acceptance_rate, 4.0 / 6.0);
  EXPECT_DOUBLE_EQ(s.mean_accepted_length, 2.0);
  EXPECT_DOUBLE_EQ(s.tokens_per_step, 7.0 / 3.0);
  EXPECT_EQ(s.num_positions, 4);
  EXPECT_EQ(m.position_drafted(), (std::vector<uint64_t>{2, 2, 1, 1}));
  EXPECT_EQ(m.position_accepted(), (std::vector<uint64_t>{2, 2, 0, 0}));
  EXPECT_EQ(m.arms()[0].pulls, 2u);
  EXPECT_EQ(m.arms()[0].draft_tokens, 4u);
  EXPECT_EQ(m.arms()[1].accepted_tokens, 2u);
  EXPECT_NEAR(s.latency_p50_seconds, 2e-3, 2e-3 * 0.023);
  EXPECT_NEAR(s.latency_p99_seconds, 3e-3, 3e-3 * 0.023);
  m.reset();
  s = m.snapshot();
  EXPECT_EQ(s.steps, 0u);
  EXPECT_EQ(s.num_positions, 0);
  EXPECT_EQ(m.arms().size(), 2u);
  EXPECT_EQ(m.arms()[0].pulls, 0u);
  EXPECT_EQ(s.latency_p50_seconds, 0.0);
}

TEST(LatencyHistogram, QuantilesWithinTheBucketWidth) {
  LatencyHistogram h;
  // 1000 latencies from 10 µs to 10 ms, log-spaced.
  std::vector<double> values;
  for (int i = 0; i < 1000; ++i) values.push_back(1e-5 * std::pow(1000.0, i / 999.0));
  for (double v : values) h.record(v);
  EXPECT_EQ(h.count(), 1000u);
  const double p50 = values[499], p99 = values[989];
  EXPECT_NEAR(h.quantile(0.5), p50, p50 * 0.023);
  EXPECT_NEAR(h.quantile(0.99), p99, p99 * 0.023);
  // Out-of-range values land in the end buckets instead of being lost.
  LatencyHistogram edges;
  edges.record(0.0);
  edges.record(1e9);
  EXPECT_EQ(edges.count(), 2u);
  EXPECT_LT(edges.quantile(0.0), 2e-7);
  EXPECT_GT(edges.quantile(1.0), 1e3);
}

}  // namespace
