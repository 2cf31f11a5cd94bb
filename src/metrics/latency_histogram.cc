#include "metrics/latency_histogram.h"

#include <algorithm>
#include <cmath>

namespace flashspec {

void LatencyHistogram::record(double seconds) {
  int bucket = 0;
  if (seconds > kBaseSeconds) {
    const double position = std::log2(seconds / kBaseSeconds) * kBucketsPerOctave;
    bucket = position >= double(kBuckets - 1) ? kBuckets - 1 : int(position);
  }
  buckets_[size_t(bucket)] += 1;
  count_ += 1;
}

double LatencyHistogram::quantile(double q) const {
  if (count_ == 0) return 0.0;
  q = std::min(1.0, std::max(0.0, q));
  // The smallest bucket whose cumulative count reaches rank ceil(q · count).
  const uint64_t rank = std::max<uint64_t>(1, uint64_t(std::ceil(q * double(count_))));
  uint64_t seen = 0;
  int bucket = kBuckets - 1;
  for (int b = 0; b < kBuckets; ++b) {
    seen += buckets_[size_t(b)];
    if (seen >= rank) {
      bucket = b;
      break;
    }
  }
  return kBaseSeconds * std::exp2((double(bucket) + 0.5) / kBucketsPerOctave);
}

void LatencyHistogram::reset() {
  buckets_.fill(0);
  count_ = 0;
}

}  // namespace flashspec
