package flashspec

import (
	"fmt"
	"math"

	"github.com/flashspec/flashspec/bindings/go/internal/capi"
)

// Vocabulary shards (see "Vocabulary shards" in flashspec.h): rank k of a
// tensor-parallel LM head holds the rows [vocabBegin, vocabBegin + rows) of
// a global vocabulary. Each rank's VerifyShard or DraftShard writes one
// ShardRecordBytes record per row into a caller []byte; the ranks gather
// the records in rank order with their own communicator ([numShards][rows]
// records, numShards × rows × ShardRecordBytes bytes) and any rank calls
// FinalizeShards or DraftFromShards, which give exactly what
// VerifyAndFinalize and Draft give on the whole head. Token ids are global
// throughout.

const (
	// ShardRecordBytes is the size of one row's record.
	ShardRecordBytes = capi.FLASHSPEC_SHARD_RECORD_BYTES
	// ShardRecordVersion is the record layout this binding was built for;
	// the library refuses gathered records of another version.
	ShardRecordVersion = capi.FLASHSPEC_SHARD_RECORD_VERSION
)

// NewLMHeadShard uploads one rank's slice of a vocabulary-sharded LM head:
// w is row-major [rows, hidden] float32 (copied), the weights of the global
// tokens [vocabBegin, vocabBegin + rows) of a vocabulary of vocabSize
// tokens. A shard head serves only the shard calls (VerifyShard,
// FinalizeShards, DraftShard); Draft and Verify refuse it.
func (c *Context) NewLMHeadShard(w []float32, rows, hidden, vocabBegin, vocabSize int) (*LMHead, error) {
	head, err := c.uploadLMHead(w, rows, hidden, func(raw capi.Struct_SS_flashspec_context, t capi.Flashspec_tensor, slot uintptr) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_lm_head_create_shard(raw, t, capi.FLASHSPEC_LM_HEAD_COPY, int64(vocabBegin), int64(vocabSize), slot)
	})
	if err != nil {
		return nil, err
	}
	head.vocab = vocabSize
	return head, nil
}

// VocabBegin is the global id of the head's first token (0 unless a shard).
func (h *LMHead) VocabBegin() int { return int(capi.Flashspec_lm_head_vocab_begin(h.raw)) }

// GlobalVocabSize is the size of the global vocabulary (VocabSize unless a shard).
func (h *LMHead) GlobalVocabSize() int { return int(capi.Flashspec_lm_head_global_vocab_size(h.raw)) }

// checkRecordsFor makes sure records can hold the rows records a shard
// pass writes (a longer slice keeps its tail).
func checkRecordsFor(records []byte, rows int) error {
	if len(records)/ShardRecordBytes < rows {
		return &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("records: %d bytes, fewer than %d rows × %d", len(records), rows, ShardRecordBytes)}
	}
	return nil
}

// checkGathered makes sure records is exactly numShards × rows records, the
// gather the library reads.
func checkGathered(records []byte, numShards, rows int) error {
	if numShards < 1 || numShards > math.MaxInt32 {
		return &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("numShards: %d, outside [1, 2^31)", numShards)}
	}
	if rows < 1 || rows > math.MaxInt32 {
		return &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("rows: %d, outside [1, 2^31)", rows)}
	}
	// Divisions rather than numShards*rows*ShardRecordBytes, which wraps for
	// huge sizes.
	perShard := rows * ShardRecordBytes
	if len(records)%perShard != 0 || len(records)/perShard != numShards {
		return &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("records: %d bytes, expected %d shards × %d rows × %d",
			len(records), numShards, rows, ShardRecordBytes)}
	}
	return nil
}

// VerifyShard is one rank's verify pass over its slice (head from
// NewLMHeadShard): it writes the batch's DraftOffsets[R] + R records to the
// start of records, which must hold them (else ErrOutOfRange, records
// untouched). Gather every rank's records, then FinalizeShards. The batch
// takes no DraftLogits, Controls or Logprobs (ErrUnsupported: they would
// need a second exchange).
func (c *Context) VerifyShard(head *LMHead, b *VerifyBatch, records []byte) error {
	hr, err := head.handle()
	if err != nil {
		return err
	}
	var a arena
	defer a.free()
	batch, release, err := b.cBatch(&a, head)
	if err != nil {
		return err
	}
	defer release()
	// cBatch checked that TargetHidden has DraftOffsets[R] + R rows.
	requests := len(b.DraftOffsets) - 1
	rows := int(b.DraftOffsets[requests]) + requests
	if err := checkRecordsFor(records, rows); err != nil {
		return err
	}
	rp := out[byte](&a, rows*ShardRecordBytes)
	if err := c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_verify_shard(raw, hr, batch, uintptr(rp))
	}); err != nil {
		return err
	}
	copy(records, back[byte](rp, rows*ShardRecordBytes))
	return nil
}

// FinalizeShards runs Algorithm 1 on the gathered records of numShards
// ranks: records is [numShards][rows] records in rank order, rows =
// DraftOffsets[R] + R, exactly numShards × rows × ShardRecordBytes bytes
// (else ErrOutOfRange before the call). head is any shard head of the
// batch (it gives the hidden size the batch is checked against). A gather
// whose records have another version, or whose slices do not tile the
// vocabulary in rank order, is the library's ErrInvalidArgument naming
// "records".
func (c *Context) FinalizeShards(head *LMHead, b *VerifyBatch, records []byte, numShards int) (*VerifyResult, error) {
	if _, err := head.handle(); err != nil {
		return nil, err
	}
	rows, err := b.checkSizes(head)
	if err != nil {
		return nil, err
	}
	if err := checkGathered(records, numShards, rows); err != nil {
		return nil, err
	}
	var a arena
	defer a.free()
	rp := in(&a, records)
	return c.finalizeWith(b, head, func(raw capi.Struct_SS_flashspec_context, batch capi.Flashspec_verify_batch, result capi.Flashspec_verify_result) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_finalize_shards(raw, batch, rp, numShards, result)
	})
}

// DraftShard is one rank's draft pass over its slice (head from
// NewLMHeadShard): one record per row of hidden ([rows, d] row-major),
// written to the start of records, which must hold them (else
// ErrOutOfRange, records untouched). Gather every rank's records, then
// DraftFromShards with the same options. Options take no Controls
// (ErrUnsupported).
func (c *Context) DraftShard(head *LMHead, hidden []float32, records []byte, o *DraftOptions) error {
	hr, err := head.handle()
	if err != nil {
		return err
	}
	rows, err := rowsOf(hidden, head.hidden, "hidden")
	if err != nil {
		return err
	}
	if err := checkRecordsFor(records, rows); err != nil {
		return err
	}
	var a arena
	defer a.free()
	p, release, err := o.cParams(&a, rows, head.vocab)
	if err != nil {
		return err
	}
	defer release()
	t := capi.Flashspec_tensor_make(in(&a, hidden), capi.FLASHSPEC_DTYPE_F32, capi.FLASHSPEC_MEMORY_HOST, int64(rows), int64(head.hidden))
	defer capi.DeleteFlashspec_tensor(t)
	rp := out[byte](&a, rows*ShardRecordBytes)
	if err := c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_draft_shard(raw, hr, t, p, uintptr(rp))
	}); err != nil {
		return err
	}
	copy(records, back[byte](rp, rows*ShardRecordBytes))
	return nil
}

// DraftFromShards gives the drafts of rows hidden rows from the gathered
// records of numShards ranks ([numShards][rows] records in rank order,
// exactly numShards × rows × ShardRecordBytes bytes, else ErrOutOfRange
// before the call): what Draft on the whole head gives for the same
// options. Malformed gathers are the library's ErrInvalidArgument naming
// "records". Options take no Controls: without a head the binding cannot
// size their token mask, and shard calls refuse them (ErrUnsupported).
func (c *Context) DraftFromShards(records []byte, numShards, rows int, o *DraftOptions) (tokens []int32, scores []float32, err error) {
	if err := checkGathered(records, numShards, rows); err != nil {
		return nil, nil, err
	}
	if o != nil && o.Controls != nil {
		return nil, nil, &Error{Status: ErrUnsupported, Message: "Controls: sampling controls need the global ranking: shard calls do not take them"}
	}
	var a arena
	defer a.free()
	p, release, err := o.cParams(&a, rows, 0)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	rp := in(&a, records)
	tp, sp := out[int32](&a, rows), out[float32](&a, rows)
	if err := c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_draft_from_shards(raw, p, rp, numShards, rows, uintptr(tp), uintptr(sp))
	}); err != nil {
		return nil, nil, err
	}
	return back[int32](tp, rows), back[float32](sp, rows), nil
}
