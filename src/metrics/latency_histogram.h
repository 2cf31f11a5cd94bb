// Step latencies in a fixed log-scale histogram: constant memory and O(1)
// per record, whatever the number of steps. Bucket b holds latencies in
// [base · r^b, base · r^(b+1)) with r = 2^(1/16), so a percentile read from
// the bucket's geometric middle is within ±2.2% of the true value; values
// below 100 ns or above ~1.7 hours land in the end buckets.
#pragma once

#include <array>
#include <cstdint>

namespace flashspec {

class LatencyHistogram {
 public:
  static constexpr int kBucketsPerOctave = 16;
  static constexpr int kOctaves = 36;  // 100 ns · 2^36 ≈ 6900 s
  static constexpr int kBuckets = kBucketsPerOctave * kOctaves;
  static constexpr double kBaseSeconds = 1e-7;

  void record(double seconds);
  // The q-quantile (0 ≤ q ≤ 1) in seconds; 0 when nothing was recorded.
  double quantile(double q) const;
  uint64_t count() const { return count_; }
  void reset();

 private:
  std::array<uint64_t, kBuckets> buckets_{};
  uint64_t count_ = 0;
};

}  // namespace flashspec
