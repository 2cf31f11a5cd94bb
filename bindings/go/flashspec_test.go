package flashspec

import (
	"errors"
	"math"
	"math/rand"
	"os"
	"strings"
	"testing"
)

const testV, testD = 40, 12

func randomRows(r *rand.Rand, rows, cols int) []float32 {
	v := make([]float32, rows*cols)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func logits(w, h []float32, row int) []float64 {
	l := make([]float64, testV)
	for t := 0; t < testV; t++ {
		for k := 0; k < testD; k++ {
			l[t] += float64(h[row*testD+k]) * float64(w[t*testD+k])
		}
	}
	return l
}

func argmax(v []float64) int {
	best := 0
	for i := range v {
		if v[i] > v[best] {
			best = i
		}
	}
	return best
}

func newFixture(t *testing.T) (*Context, *LMHead, []float32) {
	t.Helper()
	ctx, err := NewContext(&ContextOptions{Backend: BackendCPU, Seed: 42, CPUThreads: 2, MaxRows: 64})
	if err != nil {
		t.Fatal(err)
	}
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	head, err := ctx.NewLMHead(w, testV, testD)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { head.Close(); ctx.Close() })
	return ctx, head, w
}

func TestVersion(t *testing.T) {
	if Version() == "" || VersionNumber() == 0 && Version() != "0.0.0" {
		t.Fatalf("version %q %d", Version(), VersionNumber())
	}
	if ABIVersion() != uint(ABIVersionCompiled) {
		t.Fatalf("ABI %d, compiled for %d", ABIVersion(), ABIVersionCompiled)
	}
	if ErrOutOfRange.Name() != "FLASHSPEC_ERR_OUT_OF_RANGE" || OK.Error() != "success" {
		t.Fatal(ErrOutOfRange.Name(), OK.Error())
	}
}

func TestGreedyDraftMatchesReference(t *testing.T) {
	ctx, head, w := newFixture(t)
	if head.VocabSize() != testV || head.HiddenSize() != testD {
		t.Fatal(head.VocabSize(), head.HiddenSize())
	}
	h := randomRows(rand.New(rand.NewSource(2)), 5, testD)
	tokens, scores, err := ctx.Draft(head, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 5; r++ {
		l := logits(w, h, r)
		if int(tokens[r]) != argmax(l) || math.Abs(float64(scores[r])-l[argmax(l)]) > 1e-4 {
			t.Fatalf("row %d: %d %g, want %d %g", r, tokens[r], scores[r], argmax(l), l[argmax(l)])
		}
	}
}

func TestSampledDraftFollowsTheRandomnessContract(t *testing.T) {
	ctx, head, w := newFixture(t)
	h := randomRows(rand.New(rand.NewSource(3)), 3, testD)
	o := &DraftOptions{Temperature: 0.5, Seeds: []uint64{7, 8, 9}, RequestIDs: []uint64{1, 2, 3},
		Steps: []uint64{0, 4, 2}, Positions: []int32{0, 1, 2}}
	tokens, _, err := ctx.Draft(head, h, o)
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 3; r++ {
		l := logits(w, h, r)
		scores := make([]float64, testV)
		for i := range l {
			u := RNGUniform(o.Seeds[r], o.RequestIDs[r], o.Steps[r], o.Positions[r], RNGDraftNoise, int32(i))
			scores[i] = l[i]/0.5 - math.Log(-math.Log(u))
		}
		if int(tokens[r]) != argmax(scores) {
			t.Fatalf("row %d: token %d, want %d", r, tokens[r], argmax(scores))
		}
	}
}

func TestGreedyVerifyEqualsGreedyDecoding(t *testing.T) {
	ctx, head, w := newFixture(t)
	hidden := randomRows(rand.New(rand.NewSource(4)), 5, testD) // requests of 2 and 1 drafts
	best := func(row int) int32 { return int32(argmax(logits(w, hidden, row))) }
	// Request 0: first draft right, second wrong. Request 1: its draft right.
	drafts := []int32{best(0), (best(1) + 1) % testV, best(3)}
	batch := &VerifyBatch{DraftOffsets: []int32{0, 2, 3}, DraftTokens: drafts, TargetHidden: hidden,
		Temperatures: []float32{0, 0}, Steps: []uint64{10, 20}}
	res, err := ctx.VerifyAndFinalize(head, batch)
	if err != nil {
		t.Fatal(err)
	}
	want0, want1 := []int32{drafts[0], best(1)}, []int32{drafts[2], best(4)}
	if !equal(res.Tokens(0), want0) || !equal(res.Tokens(1), want1) {
		t.Fatalf("tokens %v %v, want %v %v", res.Tokens(0), res.Tokens(1), want0, want1)
	}
	if res.EmittedTokens[2] != -1 || res.NextSteps[0] != 11 || res.NextSteps[1] != 21 {
		t.Fatalf("emitted %v next steps %v", res.EmittedTokens, res.NextSteps)
	}

	summaries, err := ctx.NewSummaries(16, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer summaries.Close()
	if err := ctx.Verify(head, batch, summaries); err != nil {
		t.Fatal(err)
	}
	split, err := ctx.Finalize(head, batch, summaries)
	if err != nil || !equal(split.EmittedTokens, res.EmittedTokens) {
		t.Fatalf("split %v %v, fused %v", split, err, res.EmittedTokens)
	}

	// Greedy: the same batch without the temperatures; not with them.
	flagged := *batch
	flagged.Temperatures, flagged.Greedy = nil, true
	greedy, err := ctx.VerifyAndFinalize(head, &flagged)
	if err != nil || !equal(greedy.EmittedTokens, res.EmittedTokens) || !equal(greedy.AcceptedCounts, res.AcceptedCounts) {
		t.Fatalf("greedy %v %v, temperatures 0 %v", greedy, err, res.EmittedTokens)
	}
	flagged.Temperatures = []float32{0, 0}
	var e *Error
	if _, err := ctx.VerifyAndFinalize(head, &flagged); !errors.As(err, &e) || e.Status != ErrInvalidArgument ||
		!strings.Contains(e.Message, "batch->temperatures") {
		t.Fatalf("greedy with temperatures: %v", err)
	}
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestErrorsCarryStatusAndMessage(t *testing.T) {
	ctx, head, _ := newFixture(t)
	_, err := ctx.VerifyAndFinalize(head, &VerifyBatch{DraftOffsets: []int32{0, 1},
		DraftTokens: []int32{testV + 5}, TargetHidden: make([]float32, 2*testD)})
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrOutOfRange) || !strings.Contains(e.Message, "draft_tokens") {
		t.Fatalf("got %v", err)
	}
	if ctx.LastError() != e.Message {
		t.Fatalf("last error %q, message %q", ctx.LastError(), e.Message)
	}
	bad := make([]float32, testD)
	bad[1] = float32(math.Inf(1))
	if _, _, err := ctx.Draft(head, bad, nil); !errors.Is(err, ErrNonFinite) {
		t.Fatalf("got %v", err)
	}
	if _, _, err := ctx.Draft(head, make([]float32, testD), &DraftOptions{Temperature: -1}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("got %v", err)
	}
	if CUDADeviceCount() == 0 {
		if _, err := NewContext(&ContextOptions{Backend: BackendCUDA}); !errors.Is(err, ErrNoDevice) || err.(*Error).Message == "" {
			t.Fatalf("got %v", err)
		}
	}
}

func TestCloseTwiceAndUseAfterClose(t *testing.T) {
	ctx, err := NewContext(&ContextOptions{Backend: BackendCPU})
	if err != nil {
		t.Fatal(err)
	}
	head, err := ctx.NewLMHead(make([]float32, testV*testD), testV, testD)
	if err != nil {
		t.Fatal(err)
	}
	head.Close()
	head.Close()
	if _, _, err := ctx.Draft(head, make([]float32, testD), nil); err != errClosed {
		t.Fatalf("got %v", err)
	}
	ctx.Close()
	ctx.Close()
	if _, err := ctx.NewSummaries(1, 1); err != errClosed {
		t.Fatalf("got %v", err)
	}
}

func TestPhiloxAndPluginTable(t *testing.T) {
	// Random123 known answer for zero counter and key.
	if got := Philox4x32_10([4]uint32{}, [2]uint32{}); got != [4]uint32{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8} {
		t.Fatalf("%x", got)
	}
	table, ok := GetAPI(uint(ABIVersionCompiled))
	if !ok || table.ABIVersion != uint32(ABIVersionCompiled) || table.StructSize < 20*8 {
		t.Fatal(table, ok)
	}
	if table.VersionNumber() != VersionNumber() {
		t.Fatal(table.VersionNumber())
	}
	if _, ok := GetAPI(uint(ABIVersionCompiled) + 1); ok {
		t.Fatal("a table for a future ABI")
	}
}

// Each Go block of bindings/README.md is taken verbatim from an example
// (example_test.go, example_engine_test.go, example_batch_engine_test.go, example_controls_test.go,
// example_shards_test.go, example_sparse_test.go, example_suffix_test.go), which go test runs.
func TestReadmeSnippetIsFromTheExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var examples string
	for _, name := range []string{"example_test.go", "example_engine_test.go", "example_batch_engine_test.go", "example_controls_test.go", "example_shards_test.go", "example_sparse_test.go", "example_suffix_test.go", "example_quantized_test.go"} {
		example, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		examples += string(example)
	}
	parts := strings.Split(string(readme), "```go\n")
	if len(parts) < 5 {
		t.Fatalf("%d Go blocks in bindings/README.md, want the core, the controls, the shards and the engine one", len(parts)-1)
	}
	for _, part := range parts[1:] {
		block := strings.SplitN(part, "```", 2)[0]
		if len(block) < 200 || !strings.Contains(examples, block) {
			t.Fatalf("a Go block of the README is not part of the examples:\n%s", block)
		}
	}
}
