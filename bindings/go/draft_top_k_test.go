package flashspec

import (
	"errors"
	"math"
	"math/rand"
	"strings"
	"testing"
)

func TestDraftTopKRanksTheLogSoftmaxOfTheLogits(t *testing.T) {
	ctx, head, w := newFixture(t)
	const rows, k = 4, 5
	h := randomRows(rand.New(rand.NewSource(21)), rows, testD)
	tokens, logprobs, err := ctx.DraftTopK(head, h, k, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tokens) != rows*k || len(logprobs) != rows*k {
		t.Fatalf("%d tokens, %d logprobs for %d x %d", len(tokens), len(logprobs), rows, k)
	}
	for r := 0; r < rows; r++ {
		l := logits(w, h, r)
		ranked, ref := byRawLogit(l), logSoftmax(l)
		mass := 0.0
		for i := 0; i < k; i++ {
			got, lp := tokens[r*k+i], float64(logprobs[r*k+i])
			if got != ranked[i] || math.Abs(lp-ref[ranked[i]]) > 1e-4 {
				t.Fatalf("row %d slot %d: %d %g, want %d %g", r, i, got, lp, ranked[i], ref[ranked[i]])
			}
			mass += math.Exp(lp)
		}
		// Log-probabilities over the vocabulary, not renormalised over the k.
		if mass > 1-1e-3 {
			t.Fatalf("row %d: the top %d hold mass %g", r, k, mass)
		}
	}
}

func TestDraftTopKOfOneIsTheGreedyDraft(t *testing.T) {
	ctx, head, _ := newFixture(t)
	const rows = 6
	h := randomRows(rand.New(rand.NewSource(22)), rows, testD)
	greedy, _, err := ctx.Draft(head, h, &DraftOptions{Temperature: 0})
	if err != nil {
		t.Fatal(err)
	}
	one, _, err := ctx.DraftTopK(head, h, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	full, _, err := ctx.DraftTopK(head, h, MaxDraftTopK, nil)
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < rows; r++ {
		if one[r] != greedy[r] || full[r*MaxDraftTopK] != greedy[r] {
			t.Fatalf("row %d: top-1 %d, first of top-%d %d, greedy %d", r, one[r], MaxDraftTopK, full[r*MaxDraftTopK], greedy[r])
		}
	}
}

func TestDraftTopKAppliesTheBiasAndMaskOfItsControls(t *testing.T) {
	ctx, head, w := newFixture(t)
	const rows, k = 2, 4
	h := randomRows(rand.New(rand.NewSource(23)), rows, testD)
	allowedIDs := [][]int{{10, 12, 13, 20, 21, 30, 31}, {3, 7}} // row 1: fewer than k
	allowed := make([][]bool, rows)
	for r, ids := range allowedIDs {
		allowed[r] = make([]bool, testV)
		for _, id := range ids {
			allowed[r][id] = true
		}
	}
	mask, err := PackTokenMask(allowed, testV)
	if err != nil {
		t.Fatal(err)
	}
	controls := &SamplingControls{TokenMask: mask}
	bias := map[int32]float32{12: 5, 3: -2}
	controls.SetLogitBias([]map[int32]float32{bias, bias})
	tokens, logprobs, err := ctx.DraftTopK(head, h, k, &DraftOptions{Controls: controls})
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < rows; r++ {
		kept := biased(logits(w, h, r), allowed[r], bias)
		ranked, ref := byRawLogit(kept), logSoftmax(kept)
		for i := 0; i < k; i++ {
			got, lp := tokens[r*k+i], float64(logprobs[r*k+i])
			if i >= len(allowedIDs[r]) {
				if got != -1 || !math.IsInf(lp, -1) {
					t.Fatalf("row %d slot %d past its allowed tokens: %d %g", r, i, got, lp)
				}
				continue
			}
			if got != ranked[i] || math.Abs(lp-ref[ranked[i]]) > 1e-4 {
				t.Fatalf("row %d slot %d: %d %g, want %d %g", r, i, got, lp, ranked[i], ref[ranked[i]])
			}
		}
	}
}

func TestDraftTopKRefusesKOutsideOneToTheMaximum(t *testing.T) {
	ctx, head, _ := newFixture(t)
	h := make([]float32, 2*testD)
	for _, k := range []int{0, -1, MaxDraftTopK + 1, math.MaxInt32 + 1, math.MinInt32 - 1} {
		_, _, err := ctx.DraftTopK(head, h, k, nil)
		var e *Error
		if !errors.As(err, &e) || !errors.Is(err, ErrOutOfRange) || !strings.Contains(e.Message, "k") {
			t.Fatalf("k = %d: got %v", k, err)
		}
	}
	_, _, err := ctx.DraftTopK(head, h, 3, &DraftOptions{Controls: &SamplingControls{TopP: []float32{0.9, 0.9}}})
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("top-p controls: got %v", err)
	}
}
