package flashspec

import (
	"errors"
	"math"
	"math/rand"
	"sort"
	"strings"
	"testing"
)

// Sampling controls and logprobs on the CPU backend, against float64
// references, and every control slice checked before the call.

func randomAllowed(r *rand.Rand, rows int) [][]bool {
	allowed := make([][]bool, rows)
	for i := range allowed {
		allowed[i] = make([]bool, testV)
		any := false
		for t := range allowed[i] {
			allowed[i][t] = r.Intn(3) == 0
			any = any || allowed[i][t]
		}
		if !any {
			allowed[i][0] = true
		}
	}
	return allowed
}

func logSoftmax(l []float64) []float64 {
	m := math.Inf(-1)
	for _, x := range l {
		m = math.Max(m, x)
	}
	s := 0.0
	for _, x := range l {
		s += math.Exp(x - m)
	}
	out := make([]float64, len(l))
	for i, x := range l {
		out[i] = x - m - math.Log(s)
	}
	return out
}

// biased is l + bias over the allowed tokens, -Inf elsewhere.
func biased(l []float64, allowed []bool, bias map[int32]float32) []float64 {
	x := make([]float64, len(l))
	for t := range l {
		x[t] = math.Inf(-1)
		if allowed[t] {
			x[t] = l[t] + float64(bias[int32(t)])
		}
	}
	return x
}

// byRawLogit is the token ids by decreasing logit, ties by smaller id.
func byRawLogit(l []float64) []int32 {
	ids := make([]int32, len(l))
	for i := range ids {
		ids[i] = int32(i)
	}
	sort.SliceStable(ids, func(a, b int) bool { return l[ids[a]] > l[ids[b]] })
	return ids
}

func TestControlledVerifyAtTemperatureZeroIsGreedyOverTheControlledSet(t *testing.T) {
	ctx, head, w := newFixture(t)
	r := rand.New(rand.NewSource(21))
	const R, n, topN = 3, 3, 4
	rows := R * (n + 1)
	hidden := randomRows(r, rows, testD)
	allowed := randomAllowed(r, rows)
	bias := make([]map[int32]float32, R)
	for i := range bias {
		bias[i] = map[int32]float32{int32(r.Intn(testV)): 3, int32(r.Intn(testV)): -2}
	}
	greedy := make([]int32, rows)
	for row := range greedy {
		greedy[row] = int32(argmax(biased(logits(w, hidden, row), allowed[row], bias[row/(n+1)])))
	}
	// Request r drafts the controlled argmax, but a wrong token at position r.
	offsets, drafts := []int32{0}, []int32{}
	for req := 0; req < R; req++ {
		for j := 0; j < n; j++ {
			token := greedy[req*(n+1)+j]
			if j == req {
				token = (token + 1) % testV
			}
			drafts = append(drafts, token)
		}
		offsets = append(offsets, int32(len(drafts)))
	}
	mask, err := PackTokenMask(allowed, testV)
	if err != nil {
		t.Fatal(err)
	}
	controls := &SamplingControls{TokenMask: mask, TopK: []int32{3, 1, TopKAll}, TopP: []float32{0.5, 1, 0.9},
		MinP: []float32{0.5, 0, 1}}
	controls.SetLogitBias(bias)
	res, err := ctx.VerifyAndFinalize(head, &VerifyBatch{DraftOffsets: offsets, DraftTokens: drafts, TargetHidden: hidden,
		Temperatures: make([]float32, R), Controls: controls, Logprobs: true, TopLogprobs: topN})
	if err != nil {
		t.Fatal(err)
	}
	if res.TopN != topN || len(res.TopTokens) != rows*topN || len(res.Logprobs) != rows || len(res.RawLogprobs) != rows {
		t.Fatalf("sizes: %d %d %d %d", res.TopN, len(res.TopTokens), len(res.Logprobs), len(res.RawLogprobs))
	}
	for req := 0; req < R; req++ {
		if int(res.AcceptedCounts[req]) != req {
			t.Fatalf("request %d accepted %d drafts, want %d", req, res.AcceptedCounts[req], req)
		}
		for k, token := range res.Tokens(req) {
			if token != greedy[req*(n+1)+k] {
				t.Fatalf("request %d slot %d: %d, the controlled argmax is %d", req, k, token, greedy[req*(n+1)+k])
			}
		}
		for _, lp := range res.TokenLogprobs(req, false) {
			if lp != 0 {
				t.Fatalf("request %d: logprob %v at T = 0, want 0 (a point mass)", req, lp)
			}
		}
		for k := 0; k <= n; k++ {
			slot := req*(n+1) + k
			tokens, lps := res.Top(req, k)
			if k > req {
				if res.EmittedTokens[slot] != -1 || !math.IsNaN(float64(res.Logprobs[slot])) || !math.IsNaN(float64(res.RawLogprobs[slot])) {
					t.Fatalf("slot %d past the emitted tokens: %d %v %v", slot, res.EmittedTokens[slot], res.Logprobs[slot], res.RawLogprobs[slot])
				}
				for i := range tokens {
					if tokens[i] != -1 || !math.IsNaN(float64(lps[i])) {
						t.Fatalf("slot %d past the emitted tokens: top %v %v", slot, tokens, lps)
					}
				}
				continue
			}
			l := logits(w, hidden, slot)
			raw := logSoftmax(l)
			if lp := res.RawLogprobs[slot]; math.IsNaN(float64(lp)) || math.Abs(float64(lp)-raw[greedy[slot]]) > 1e-4 {
				t.Fatalf("slot %d raw logprob %v, want %v", slot, lp, raw[greedy[slot]])
			}
			want := byRawLogit(l)[:topN]
			for i := range want {
				if tokens[i] != want[i] || math.Abs(float64(lps[i])-raw[want[i]]) > 1e-4 {
					t.Fatalf("slot %d top %v %v, want %v", slot, tokens, lps, want)
				}
			}
		}
	}

	// The greedy draft under the same controls (per row) gives the same argmaxes.
	rowBias := make([]map[int32]float32, rows)
	for row := range rowBias {
		rowBias[row] = bias[row/(n+1)]
	}
	draftControls := &SamplingControls{TokenMask: mask}
	draftControls.SetLogitBias(rowBias)
	tokens, _, err := ctx.Draft(head, hidden, &DraftOptions{Controls: draftControls})
	if err != nil {
		t.Fatal(err)
	}
	for row, token := range tokens {
		if token != greedy[row] {
			t.Fatalf("draft row %d: %d, the controlled argmax is %d", row, token, greedy[row])
		}
	}
}

func TestLogprobsAreThoseOfTheControlledDistribution(t *testing.T) {
	ctx, head, w := newFixture(t)
	r := rand.New(rand.NewSource(22))
	const R, n = 4, 2
	const T = 0.7
	rows := R * (n + 1)
	hidden := randomRows(r, rows, testD)
	allowed := randomAllowed(r, rows)
	bias := map[int32]float32{5: 1.5, 9: -0.5}
	offsets, drafts := []int32{0}, []int32{}
	for req := 0; req < R; req++ {
		for j := 0; j < n; j++ {
			drafts = append(drafts, int32(argmax(biased(logits(w, hidden, req*(n+1)+j), allowed[req*(n+1)+j], bias))))
		}
		offsets = append(offsets, int32(len(drafts)))
	}
	mask, _ := PackTokenMask(allowed, testV)
	controls := &SamplingControls{TokenMask: mask}
	controls.SetLogitBias([]map[int32]float32{bias, bias, bias, bias})
	temps := []float32{T, T, T, T}
	res, err := ctx.VerifyAndFinalize(head, &VerifyBatch{DraftOffsets: offsets, DraftTokens: drafts, TargetHidden: hidden,
		Temperatures: temps, Controls: controls, Logprobs: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.TopTokens != nil || res.TopN != 0 {
		t.Fatal("top logprobs that were not asked for")
	}
	for req := 0; req < R; req++ {
		lps := res.TokenLogprobs(req, false)
		for k, token := range res.Tokens(req) {
			slot := req*(n+1) + k
			x := biased(logits(w, hidden, slot), allowed[slot], bias)
			for i := range x {
				x[i] /= T
			}
			p := logSoftmax(x)
			if math.IsInf(p[token], -1) {
				t.Fatalf("slot %d emitted %d, a masked token", slot, token)
			}
			if math.Abs(float64(lps[k])-p[token]) > 1e-4 {
				t.Fatalf("slot %d: logprob %v, want %v", slot, lps[k], p[token])
			}
		}
	}
}

func TestRepetitionPenaltyScalesTheLogitsOfTheNamedTokens(t *testing.T) {
	// Each row's raw argmax and argmin, named with a bias of 0 and
	// penalised: l / r for l > 0, l * r otherwise. T = 0 gives the argmax of
	// the penalised logits.
	ctx, head, w := newFixture(t)
	const rows = 12
	h := randomRows(rand.New(rand.NewSource(27)), rows, testD)
	bias := make([]map[int32]float32, rows)
	penalty := make([]float32, rows)
	for r := range bias {
		l := logits(w, h, r)
		lowest := 0
		for i := range l {
			if l[i] < l[lowest] {
				lowest = i
			}
		}
		bias[r] = map[int32]float32{int32(argmax(l)): 0, int32(lowest): 0}
		penalty[r] = 1.5 + float32(r)*3.5
	}
	controls := &SamplingControls{RepetitionPenalty: penalty}
	controls.SetLogitBias(bias)
	tokens, _, err := ctx.Draft(head, h, &DraftOptions{Controls: controls})
	if err != nil {
		t.Fatal(err)
	}
	changed := 0
	for r, token := range tokens {
		l := logits(w, h, r)
		raw := argmax(l)
		for named := range bias[r] {
			if l[named] > 0 {
				l[named] /= float64(penalty[r])
			} else {
				l[named] *= float64(penalty[r])
			}
		}
		if int(token) != argmax(l) {
			t.Fatalf("row %d: %d, the penalised argmax is %d", r, token, argmax(l))
		}
		if int(token) != raw {
			changed++
		}
	}
	if changed <= rows/2 {
		t.Fatalf("the penalty moved %d of %d argmaxes", changed, rows)
	}
}

func TestControlSlicesAreCheckedAgainstTheBatch(t *testing.T) {
	all, _ := PackTokenMask(randomAllowed(rand.New(rand.NewSource(23)), 5), testV) // 5 rows of 2 words
	for _, c := range []struct {
		want   string
		mutate func(b *VerifyBatch)
	}{
		// Each short slice is the start of a longer one: without the check
		// the library reads on past its copy.
		{"Controls.TopK: 1 entries for 2 requests", func(b *VerifyBatch) { b.Controls.TopK = []int32{5, 5, 5}[:1] }},
		{"Controls.TopP: 0 entries for 2 requests", func(b *VerifyBatch) { b.Controls.TopP = []float32{} }},
		{"Controls.MinP: 1 entries for 2 requests", func(b *VerifyBatch) { b.Controls.MinP = []float32{0.1} }},
		{"Controls.RepetitionPenalty: 1 entries for 2 requests", func(b *VerifyBatch) { b.Controls.RepetitionPenalty = []float32{2, 2}[:1] }},
		{"Controls.TypicalEpsilon: 1 entries for 2 requests", func(b *VerifyBatch) { b.Controls.TypicalEpsilon = []float32{0.1} }},
		{"Controls.TypicalDelta: 1 entries for 2 requests", func(b *VerifyBatch) {
			b.Controls.TypicalEpsilon, b.Controls.TypicalDelta = []float32{0.1, 0.1}, []float32{0.1}
		}},
		{"Controls.BiasOffsets: 2 entries for R + 1 = 3", func(b *VerifyBatch) { b.Controls.BiasOffsets = b.Controls.BiasOffsets[:2] }},
		{"Controls.BiasTokens: 2 entries for BiasOffsets[R] = 3", func(b *VerifyBatch) { b.Controls.BiasTokens = b.Controls.BiasTokens[:2] }},
		{"Controls.BiasValues: 0 entries for BiasOffsets[R] = 3", func(b *VerifyBatch) { b.Controls.BiasValues = []float32{} }},
		{"Controls.TokenMask: 8 words for 5 rows of 2 words", func(b *VerifyBatch) { b.Controls.TokenMask = all[:8] }},
		{"Controls.TokenMask: 10 words for 5 rows of 3 words", func(b *VerifyBatch) { b.Controls.MaskWords = 3 }},
		{"Controls.MaskWords: -1", func(b *VerifyBatch) { b.Controls.MaskWords = -1 }},
		{"DraftControls.TokenMask: 4 words for 3 rows of 2 words", func(b *VerifyBatch) {
			b.DraftLogits = make([]float32, 3*testV)
			b.DraftControls = &SamplingControls{TokenMask: all[:4]}
		}},
		{"DraftControls.TopK: 1 entries for 2 requests", func(b *VerifyBatch) {
			b.DraftLogits = make([]float32, 3*testV)
			b.DraftControls = &SamplingControls{TopK: []int32{4}}
		}},
		{"TopLogprobs: 21, outside [0, 20]", func(b *VerifyBatch) { b.TopLogprobs = MaxTopLogprobs + 1 }},
		{"TopLogprobs: -1, outside [0, 20]", func(b *VerifyBatch) { b.TopLogprobs = -1 }},
	} {
		t.Run(c.want, func(t *testing.T) {
			ctx, head, _ := newFixture(t)
			b := boundsBatch()
			b.Controls = &SamplingControls{TopK: []int32{5, 5}, BiasOffsets: []int32{0, 1, 3}, BiasTokens: []int32{1, 2, 3},
				BiasValues: []float32{1, 1, 1}, TokenMask: all}
			b.Logprobs, b.TopLogprobs = true, 2
			if _, err := ctx.VerifyAndFinalize(head, b); err != nil {
				t.Fatalf("the unmodified batch: %v", err)
			}
			c.mutate(b)
			res, err := ctx.VerifyAndFinalize(head, b)
			if res != nil {
				t.Fatalf("a result %+v", res)
			}
			refusedBeforeTheCall(t, ctx, err, c.want)
			summaries, err := ctx.NewSummaries(16, 4)
			if err != nil {
				t.Fatal(err)
			}
			defer summaries.Close()
			refusedBeforeTheCall(t, ctx, ctx.Verify(head, b, summaries), c.want)
			_, err = ctx.Finalize(head, b, summaries)
			refusedBeforeTheCall(t, ctx, err, c.want)
		})
	}
}

func TestDraftControlsArePerRow(t *testing.T) {
	ctx, head, _ := newFixture(t)
	h := randomRows(rand.New(rand.NewSource(24)), 3, testD)
	mask, _ := PackTokenMask(randomAllowed(rand.New(rand.NewSource(25)), 3), testV)
	for _, c := range []struct {
		want     string
		controls SamplingControls
	}{
		{"Controls.TopK: 2 entries for 3 rows", SamplingControls{TopK: []int32{1, 1}}},
		{"Controls.BiasOffsets: 3 entries for R + 1 = 4", SamplingControls{BiasOffsets: []int32{0, 0, 0}}},
		{"Controls.TokenMask: 4 words for 3 rows of 2 words", SamplingControls{TokenMask: mask[:4]}},
	} {
		_, _, err := ctx.Draft(head, h, &DraftOptions{Controls: &c.controls})
		refusedBeforeTheCall(t, ctx, err, c.want)
	}
	if _, _, err := ctx.Draft(head, h, &DraftOptions{Controls: &SamplingControls{TokenMask: mask, TopK: []int32{1, 2, 3}}}); err != nil {
		t.Fatal(err)
	}
}

func TestLibraryErrorsNameTheControl(t *testing.T) {
	ctx, head, _ := newFixture(t)
	b := boundsBatch()
	b.Controls = &SamplingControls{TopP: []float32{0.5, 0}}
	_, err := ctx.VerifyAndFinalize(head, b)
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrInvalidArgument) || !strings.HasPrefix(e.Message, "batch->controls->top_p") {
		t.Fatalf("got %v", err)
	}
	h := randomRows(rand.New(rand.NewSource(26)), 2, testD)
	_, _, err = ctx.Draft(head, h, &DraftOptions{Controls: &SamplingControls{TypicalEpsilon: []float32{0.1, 0.1}}})
	if !errors.As(err, &e) || !errors.Is(err, ErrInvalidArgument) || !strings.HasPrefix(e.Message, "params->controls->typical_epsilon") {
		t.Fatalf("got %v", err)
	}
	if _, err := PackTokenMask([][]bool{make([]bool, testV-1)}, testV); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("a short mask row: %v", err)
	}
}
