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

// A row's Partial as its record carries it: a non-finite hidden row makes
// every logit of the row non-finite, whichever rank scanned it.
FS_HOST_DEVICE Partial with_hidden_flag(Partial partial, int32_t hidden_bad) {
  if (hidden_bad) partial.flags |= kPartialNonFinite;
  return partial;
}

// Whether row `row`'s records tile [0, vocab) in rank order: the rank of the
// first record that has another version or does not continue its
// predecessor's slice, `shards` when the slices stop short of vocab, and −1
// when the row's records are sound. The host checks host records with it
// before a call; a device backend checks device records per row.
FS_HOST_DEVICE int32_t first_bad_record(const ShardRecord* records, int32_t shards, int32_t rows, int32_t row,
                                        int32_t vocab) {
  int32_t next = 0;
  for (int32_t k = 0; k < shards; ++k) {
    const ShardRecord& r = records[int64_t(k) * rows + row];
    if (r.version != FLASHSPEC_SHARD_RECORD_VERSION || r.vocab_size != vocab || r.vocab_begin != next ||
        r.vocab_end <= r.vocab_begin || r.vocab_end > vocab)
      return k;
    next = r.vocab_end;
  }
  return next == vocab ? -1 : shards;
}

// Row `row` of `rows` over the gathered records [shards][rows], merged in
// rank order.
FS_HOST_DEVICE Partial merge_records(const ShardRecord* records, int32_t shards, int32_t rows, int32_t row) {
  Partial all = empty_partial();
  for (int32_t k = 0; k < shards; ++k) merge_partial(all, records[int64_t(k) * rows + row].partial);
  return all;
}

}  // namespace flashspec
