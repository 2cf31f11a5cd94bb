package flashspec

import (
	"errors"
	"math/rand"
	"strings"
	"testing"
)

// Every slice that the library reads is checked against the batch (or the
// rows, or the arms) before the call: a short one is an ErrOutOfRange that
// names it, and the library is never called (the context records no error).

func refusedBeforeTheCall(t *testing.T, ctx *Context, err error, want string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrOutOfRange) || !strings.Contains(e.Message, want) {
		t.Fatalf("got %v, want ErrOutOfRange with %q", err, want)
	}
	if last := ctx.LastError(); last != "" {
		t.Fatalf("the library was called and failed: %q", last)
	}
}

// boundsBatch has two requests of 2 and 1 drafts: offsets [0, 2, 3], 5 rows.
func boundsBatch() *VerifyBatch {
	r := rand.New(rand.NewSource(9))
	return &VerifyBatch{DraftOffsets: []int32{0, 2, 3}, DraftTokens: []int32{1, 2, 3},
		TargetHidden: randomRows(r, 5, testD), Temperatures: []float32{0.5, 1}, DraftTemperatures: []float32{1, 1},
		Seeds: []uint64{1, 2}, RequestIDs: []uint64{3, 4}, Steps: []uint64{5, 6},
		AcceptUniforms: []float32{0.5, 0.5, 0.5}}
}

func TestShortVerifyBatchSlicesAreRefused(t *testing.T) {
	r := rand.New(rand.NewSource(10))
	for _, c := range []struct {
		want   string
		mutate func(b *VerifyBatch)
	}{
		// Each short slice is the start of a longer one: without the check
		// the library reads on past its copy.
		{"DraftTokens: 2 entries for DraftOffsets[R] = 3", func(b *VerifyBatch) { b.DraftTokens = b.DraftTokens[:2] }},
		{"DraftTokens: 0 entries for DraftOffsets[R] = 3", func(b *VerifyBatch) { b.DraftTokens = nil }},
		{"Temperatures: 1 entries for 2 requests", func(b *VerifyBatch) { b.Temperatures = b.Temperatures[:1] }},
		{"DraftTemperatures: 1 entries for 2 requests", func(b *VerifyBatch) { b.DraftTemperatures = b.DraftTemperatures[:1] }},
		{"Seeds: 1 entries for 2 requests", func(b *VerifyBatch) { b.Seeds = b.Seeds[:1] }},
		{"RequestIDs: 1 entries for 2 requests", func(b *VerifyBatch) { b.RequestIDs = b.RequestIDs[:1] }},
		{"Steps: 0 entries for 2 requests", func(b *VerifyBatch) { b.Steps = []uint64{} }},
		{"AcceptUniforms: 2 entries for DraftOffsets[R] = 3", func(b *VerifyBatch) { b.AcceptUniforms = b.AcceptUniforms[:2] }},
		{"TargetHidden: 4 rows, expected DraftOffsets[R] + R = 5", func(b *VerifyBatch) { b.TargetHidden = b.TargetHidden[:4*testD] }},
		{"TargetHidden: 5 rows, expected DraftOffsets[R] + R = 1", func(b *VerifyBatch) { b.DraftOffsets = []int32{0, 0, -1} }},
		{"DraftLogits: 2 rows, expected DraftOffsets[R] = 3", func(b *VerifyBatch) { b.DraftLogits = randomRows(r, 2, testV) }},
		{"DraftOffsets: needs R + 1", func(b *VerifyBatch) { b.DraftOffsets = b.DraftOffsets[:1] }},
	} {
		t.Run(c.want, func(t *testing.T) {
			ctx, head, _ := newFixture(t)
			b := boundsBatch()
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
	// The unmodified batch goes through.
	ctx, head, _ := newFixture(t)
	if _, err := ctx.VerifyAndFinalize(head, boundsBatch()); err != nil {
		t.Fatal(err)
	}
	// So does a batch without drafts, with or without empty DraftTokens and DraftLogits.
	for _, empty := range []bool{false, true} {
		b := &VerifyBatch{DraftOffsets: []int32{0, 0}, TargetHidden: randomRows(r, 1, testD)}
		if empty {
			b.DraftTokens, b.DraftLogits = []int32{}, []float32{}
		}
		if res, err := ctx.VerifyAndFinalize(head, b); err != nil || len(res.Tokens(0)) != 1 {
			t.Fatal(res, err)
		}
	}
}

func TestShortDraftSlicesAreRefused(t *testing.T) {
	ctx, head, _ := newFixture(t)
	h := randomRows(rand.New(rand.NewSource(11)), 3, testD)
	seeds := []uint64{1, 2, 3}
	for _, c := range []struct {
		want string
		o    DraftOptions
	}{
		{"Seeds: 2 entries for 3 rows", DraftOptions{Seeds: seeds[:2]}},
		// An empty slice is not nil: it is not "take the default".
		{"Seeds: 0 entries for 3 rows", DraftOptions{Seeds: seeds[:0]}},
		{"Temperatures: 0 entries for 3 rows", DraftOptions{Temperatures: []float32{}}},
		{"RequestIDs: 0 entries for 3 rows", DraftOptions{RequestIDs: []uint64{}}},
		{"Steps: 0 entries for 3 rows", DraftOptions{Steps: []uint64{}}},
		{"Positions: 0 entries for 3 rows", DraftOptions{Positions: []int32{}}},
	} {
		_, _, err := ctx.Draft(head, h, &c.o)
		refusedBeforeTheCall(t, ctx, err, c.want)
	}
}

func TestOracleRewardsNeedOneEntryPerArm(t *testing.T) {
	ctx, head, m := newEngineFixture(t)
	var drafters []*Drafter
	for i := 0; i < 2; i++ {
		d, err := ctx.NewNgramDrafter(nil)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		drafters = append(drafters, d)
	}
	rewards := []float64{1, 2, 3}
	o := DefaultEngineOptions()
	o.Policy = PolicyOracle
	o.Drafters = drafters
	o.Arms = []Arm{{Drafter: drafters[0], DraftLen: 2}, {Drafter: drafters[1], DraftLen: 3}, {DraftLen: 0}}
	o.OracleRewards = rewards[:2]
	if _, err := ctx.NewEngine(head, m.forward, &o); true {
		refusedBeforeTheCall(t, ctx, err, "OracleRewards: 2 entries for 3 arms")
	}
	o.Arms = nil // one arm per drafter
	o.OracleRewards = rewards[:1]
	if _, err := ctx.NewEngine(head, m.forward, &o); true {
		refusedBeforeTheCall(t, ctx, err, "OracleRewards: 1 entries for 2 arms")
	}
	o.OracleRewards = rewards[:2]
	engine, err := ctx.NewEngine(head, m.forward, &o)
	if err != nil {
		t.Fatal(err)
	}
	engine.Close()
}

func TestLMHeadSizeOverflowIsRefused(t *testing.T) {
	ctx, _, _ := newFixture(t)
	// 2^32 · 2^32 wraps to 0 entries in an int.
	_, err := ctx.NewLMHead([]float32{}, 1<<32, 1<<32)
	refusedBeforeTheCall(t, ctx, err, "weight: 0 values for [4294967296, 4294967296]")
}
