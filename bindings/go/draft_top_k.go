package flashspec

import (
	"math"

	"github.com/flashspec/flashspec/bindings/go/internal/capi"
)

// MaxDraftTopK is the largest k DraftTopK accepts.
const MaxDraftTopK = capi.FLASHSPEC_MAX_DRAFT_TOP_K

// DraftTopK is the fused top-k draft (flashspec_draft_top_k): per row of
// hidden ([rows, d] row-major), the k allowed tokens of largest logit + bias
// in rank order (larger first, ties by smaller id) and their
// log-probabilities at temperature 1, each [rows, k] row-major. A row with
// fewer than k allowed tokens ends in -1 / -Inf. o (nil: none) may carry
// Controls with a bias, repetition penalty and mask; TopK, TopP, MinP and
// typical acceptance are ErrInvalidArgument, and o's temperatures, seeds,
// request ids, steps and positions are checked but do not change the
// result. k outside 1..MaxDraftTopK is the library's ErrOutOfRange.
func (c *Context) DraftTopK(head *LMHead, hidden []float32, k int, o *DraftOptions) (tokens []int32, logprobs []float32, err error) {
	hr, err := head.handle()
	if err != nil {
		return nil, nil, err
	}
	rows, err := rowsOf(hidden, head.hidden, "hidden")
	if err != nil {
		return nil, nil, err
	}
	var a arena
	defer a.free()
	p, release, err := o.cParams(&a, rows, head.vocab)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	t := capi.Flashspec_tensor_make(in(&a, hidden), capi.FLASHSPEC_DTYPE_F32, capi.FLASHSPEC_MEMORY_HOST, int64(rows), int64(head.hidden))
	defer capi.DeleteFlashspec_tensor(t)
	// The library refuses a k outside 1..MaxDraftTopK before it writes; the
	// buffers are sized for a k it accepts, and k is clamped into int32 so
	// any int reaches that check.
	perRow, kC := k, int32(k)
	if k < 0 {
		perRow = 0
	} else if k > MaxDraftTopK {
		perRow = MaxDraftTopK
	}
	if k < math.MinInt32 {
		kC = math.MinInt32
	} else if k > math.MaxInt32 {
		kC = math.MaxInt32
	}
	slots := rows * perRow
	tp, lp := out[int32](&a, slots), out[float32](&a, slots)
	err = c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_draft_top_k(raw, hr, t, p, int(kC), uintptr(tp), uintptr(lp))
	})
	if err != nil {
		return nil, nil, err
	}
	return back[int32](tp, slots), back[float32](lp, slots), nil
}
