package flashspec

import (
	"fmt"

	"github.com/flashspec/flashspec/bindings/go/internal/capi"
)

// Limits of a sparse draft distribution (VerifyBatch.DraftSupportOffsets).
const (
	// MaxDraftSupport is the most tokens one draft row's support may name.
	MaxDraftSupport = capi.FLASHSPEC_MAX_DRAFT_SUPPORT
	// DraftSupportTolerance is how far a row's probabilities may sum from 1.
	DraftSupportTolerance = capi.FLASHSPEC_DRAFT_SUPPORT_TOLERANCE
)

// checkSupportSizes bounds the sparse supports by what the library reads
// of them: DraftOffsets[R] + 1 offsets, then as many tokens and
// probabilities as the last offset says. The library refuses offsets that
// do not rise from 0 before it reads a token, so no earlier offset reaches
// past the last one. A slice left nil while another is given is not read:
// the library refuses the batch (ErrNullPointer naming it).
func (b *VerifyBatch) checkSupportSizes(drafts int) error {
	if b.DraftSupportOffsets == nil {
		return nil
	}
	if len(b.DraftSupportOffsets) < drafts+1 {
		return &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("DraftSupportOffsets: %d entries for DraftOffsets[R] + 1 = %d",
			len(b.DraftSupportOffsets), drafts+1)}
	}
	entries := int(b.DraftSupportOffsets[drafts])
	if entries < 0 {
		return &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("DraftSupportOffsets[%d]: %d, below 0", drafts, entries)}
	}
	for _, s := range []struct {
		name  string
		given bool
		n     int
	}{
		{"DraftSupportTokens", b.DraftSupportTokens != nil, len(b.DraftSupportTokens)},
		{"DraftSupportProbs", b.DraftSupportProbs != nil, len(b.DraftSupportProbs)},
	} {
		if s.given && s.n < entries {
			return &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("%s: %d entries for DraftSupportOffsets[%d] = %d",
				s.name, s.n, drafts, entries)}
		}
	}
	return nil
}
