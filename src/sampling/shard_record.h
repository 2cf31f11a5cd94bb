// The record a vocabulary shard's pass leaves per row (flashspec.h,
// "Vocabulary shards"): the row's Partial over the slice, with global token
// ids, and the slice it covers. Records of one row merge with merge_partial,
// in rank order, into the Partial of the whole vocabulary.
#pragma once

#include <cstdint>

#include "flashspec.h"
#include "sampling/fold.h"
#include "util/host_device.h"

namespace flashspec {

struct ShardRecord {
  Partial partial;
  int32_t version;      // FLASHSPEC_SHARD_RECORD_VERSION
  int32_t vocab_begin;  // the slice [vocab_begin, vocab_end) of a vocabulary of vocab_size
  int32_t vocab_end;
  int32_t vocab_size;
};
static_assert(sizeof(ShardRecord) == FLASHSPEC_SHARD_RECORD_BYTES, "the documented record size");

FS_HOST_DEVICE ShardRecord shard_record(const Partial& partial, int64_t vocab_begin, int64_t vocab_end,
                                        int64_t vocab_size) {
  ShardRecord r;
  r.partial = partial;
  r.version = FLASHSPEC_SHARD_RECORD_VERSION;
  r.vocab_begin = int32_t(vocab_begin);
  r.vocab_end = int32_t(vocab_end);
  r.vocab_size = int32_t(vocab_size);
  return r;
}

// Row `row` of `rows` over the gathered records [shards][rows], merged in
// rank order.
FS_HOST_DEVICE Partial merge_records(const ShardRecord* records, int32_t shards, int32_t rows, int32_t row) {
  Partial all = empty_partial();
  for (int32_t k = 0; k < shards; ++k) merge_partial(all, records[int64_t(k) * rows + row].partial);
  return all;
}

}  // namespace flashspec
