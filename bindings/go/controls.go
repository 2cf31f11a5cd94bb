package flashspec

import (
	"fmt"
	"sort"

	"github.com/flashspec/flashspec/bindings/go/internal/capi"
)

// Limits of the sampling controls and logprobs.
const (
	MaxTopK        = int32(capi.FLASHSPEC_MAX_TOP_K) // largest top-k that truncates
	TopKAll        = int32(capi.FLASHSPEC_TOP_K_ALL) // a top-k that keeps every token
	MaxTopLogprobs = capi.FLASHSPEC_MAX_TOP_LOGPROBS // most top logprobs per row (VerifyBatch.TopLogprobs)
)

// SamplingControls turn a row's logits into the distribution a draft
// samples and a verify verifies against (see "Sampling controls" in
// flashspec.h): penalties and logit bias, token mask, temperature, top-k,
// top-p, min-p, in that order. Their slices are host memory, so this binding
// applies them with the CPU backend (the CUDA backend takes controls in device
// memory through the C API; the binding does not upload them yet).
//
// Per-request slices have one entry per request of a verify (per hidden
// row of a Draft); nil leaves the step out. The logit bias is in CSR form:
// request r's entries are BiasTokens/BiasValues[BiasOffsets[r]:
// BiasOffsets[r+1]] (SetLogitBias builds them from maps);
// RepetitionPenalty r applies to the tokens the bias names (l / r for
// l > 0, else l * r, before the bias; a value of 0 names a token for the
// penalty alone). TokenMask has
// MaskWords words per row (0: ceil(V / 32)), one row per row the controls
// apply to: each target row of a verify (DraftOffsets[R] + R), each
// DraftLogits row for DraftControls (DraftOffsets[R]), each hidden row of
// a Draft; token i is allowed iff bit i % 32 of word i / 32 of its row is
// set (PackTokenMask builds it from bools). TypicalEpsilon (with
// TypicalDelta, default sqrt(ε)) turns on Medusa's typical acceptance for
// a verify's target controls; it is not distribution-preserving.
//
// Every slice is checked before the library is called: a per-request slice
// needs R entries, BiasOffsets R + 1, BiasTokens and BiasValues
// BiasOffsets[R], TokenMask rows × words (a short one is ErrOutOfRange).
type SamplingControls struct {
	TopK              []int32   // 1..MaxTopK, or ≥ V / TopKAll (no truncation)
	TopP              []float32 // (0, 1]
	MinP              []float32 // [0, 1]
	BiasOffsets       []int32   // [R + 1], non-decreasing from 0
	BiasTokens        []int32   // [BiasOffsets[R]] token ids; repeats add up
	BiasValues        []float32 // [BiasOffsets[R]] finite biases
	RepetitionPenalty []float32 // r > 0, for the tokens of the bias entries
	TokenMask         []uint32  // [rows * MaskWords] packed bits
	MaskWords         int       // words per mask row; 0: ceil(V / 32)
	TypicalEpsilon    []float32 // ε ∈ (0, 1]; 0 leaves Algorithm 1
	TypicalDelta      []float32 // δ ≥ 0
}

// SetLogitBias sets the CSR bias arrays from one map {token: bias} per
// request (a nil map: no bias for that request). Tokens of a request go in
// increasing order.
func (c *SamplingControls) SetLogitBias(perRequest []map[int32]float32) {
	c.BiasOffsets = make([]int32, 1, len(perRequest)+1)
	c.BiasTokens, c.BiasValues = []int32{}, []float32{}
	for _, bias := range perRequest {
		tokens := make([]int32, 0, len(bias))
		for t := range bias {
			tokens = append(tokens, t)
		}
		sort.Slice(tokens, func(i, j int) bool { return tokens[i] < tokens[j] })
		for _, t := range tokens {
			c.BiasTokens = append(c.BiasTokens, t)
			c.BiasValues = append(c.BiasValues, bias[t])
		}
		c.BiasOffsets = append(c.BiasOffsets, int32(len(c.BiasTokens)))
	}
}

// PackTokenMask packs allowed[row][token] (each row vocab long) into the
// mask layout: ceil(vocab / 32) words per row.
func PackTokenMask(allowed [][]bool, vocab int) ([]uint32, error) {
	if vocab < 1 {
		return nil, &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("vocab: %d", vocab)}
	}
	words := (vocab + 31) / 32
	mask := make([]uint32, len(allowed)*words)
	for r, row := range allowed {
		if len(row) != vocab {
			return nil, &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("allowed[%d]: %d tokens, the vocabulary has %d", r, len(row), vocab)}
		}
		for i, ok := range row {
			if ok {
				mask[r*words+i/32] |= 1 << (i % 32)
			}
		}
	}
	return mask, nil
}

// check makes sure the library reads no slice of c past its end, for a
// call of `requests` requests (rows, for a draft) and maskRows mask rows
// over a vocabulary of vocab tokens. It returns the words per mask row to
// pass (never 0, which would leave the library to assume ceil(V / 32)).
func (c *SamplingControls) check(name string, requests, maskRows, vocab int, per string) (int, error) {
	short := func(field string, n int, of string) error {
		return &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("%s.%s: %d entries for %s", name, field, n, of)}
	}
	perRequest := fmt.Sprintf("%d %s", requests, per)
	for _, s := range []struct {
		field string
		given bool
		n     int
	}{
		{"TopK", c.TopK != nil, len(c.TopK)}, {"TopP", c.TopP != nil, len(c.TopP)}, {"MinP", c.MinP != nil, len(c.MinP)},
		{"RepetitionPenalty", c.RepetitionPenalty != nil, len(c.RepetitionPenalty)},
		{"TypicalEpsilon", c.TypicalEpsilon != nil, len(c.TypicalEpsilon)},
		{"TypicalDelta", c.TypicalDelta != nil, len(c.TypicalDelta)},
	} {
		if s.given && s.n < requests {
			return 0, short(s.field, s.n, perRequest)
		}
	}
	if c.BiasOffsets != nil {
		if len(c.BiasOffsets) < requests+1 {
			return 0, short("BiasOffsets", len(c.BiasOffsets), fmt.Sprintf("R + 1 = %d", requests+1))
		}
		// The library checks that the offsets start at 0 and never decrease
		// before it reads the entries; it reads BiasOffsets[R] of them.
		entries := int(c.BiasOffsets[requests])
		of := fmt.Sprintf("BiasOffsets[R] = %d", entries)
		if c.BiasTokens != nil && len(c.BiasTokens) < entries {
			return 0, short("BiasTokens", len(c.BiasTokens), of)
		}
		if c.BiasValues != nil && len(c.BiasValues) < entries {
			return 0, short("BiasValues", len(c.BiasValues), of)
		}
	}
	words := c.MaskWords
	if words < 0 {
		return 0, &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("%s.MaskWords: %d", name, words)}
	}
	if words == 0 {
		words = (vocab + 31) / 32
	}
	if c.TokenMask != nil && len(c.TokenMask)/words < maskRows {
		return 0, &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("%s.TokenMask: %d words for %d rows of %d words", name, len(c.TokenMask), maskRows, words)}
	}
	return words, nil
}

// cControls builds the C struct in a's buffers (after check). The caller
// deletes it.
func (c *SamplingControls) cControls(a *arena, words int) capi.Flashspec_sampling_controls {
	s := capi.NewFlashspec_sampling_controls()
	capi.Flashspec_sampling_controls_init(s)
	s.SetTop_k(in(a, c.TopK))
	s.SetTop_p(in(a, c.TopP))
	s.SetMin_p(in(a, c.MinP))
	s.SetBias_offsets(in(a, c.BiasOffsets))
	s.SetBias_tokens(in(a, c.BiasTokens))
	s.SetBias_values(in(a, c.BiasValues))
	s.SetRepetition_penalty(in(a, c.RepetitionPenalty))
	if c.TokenMask != nil {
		s.SetToken_mask(in(a, c.TokenMask))
		s.SetMask_words(words)
	}
	s.SetTypical_epsilon(in(a, c.TypicalEpsilon))
	s.SetTypical_delta(in(a, c.TypicalDelta))
	return s
}
