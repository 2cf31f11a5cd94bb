package flashspec

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// The batched engine against the single engine on the synthetic target of
// engine_test.go: each sequence emits what a fresh Engine.Generate emits;
// one sequence's failing callback ends it alone; a failing target forward
// fails the step, which is repeated; bad input gets its status.

var batchPrompts = map[uint64][]int32{11: engPrompt, 22: {9, 1, 9, 1, 9}, 1<<64 - 1: {40, 2}}

var batchArms = []BatchArm{{0, 2}, {0, 5}, {1, 3}, {-1, 0}}

// batchHost keeps one KV cache of tokens per sequence id.
type batchHost struct {
	m       *model
	caches  map[uint64][]int32
	maxSize int
	backs   int
}

func (h *batchHost) forward(c *BatchForwardCall) ([]float32, error) {
	if c.TokenOffsets[0] != 0 || c.RowOffsets[0] != 0 {
		return nil, fmt.Errorf("offsets do not start at 0")
	}
	if len(c.SequenceIDs) > h.maxSize {
		h.maxSize = len(c.SequenceIDs)
	}
	var rows []float32
	for s, id := range c.SequenceIDs {
		cache := h.caches[id]
		if int(c.NumPast[s]) > len(cache) {
			return nil, fmt.Errorf("num_past %d beyond the cache of %d", c.NumPast[s], len(cache))
		}
		cache = append(cache[:c.NumPast[s]], c.TokensOf(s)...)
		h.caches[id] = cache
		for _, t := range cache[len(cache)-c.RowsOf(s):] {
			rows = append(rows, h.m.e[int(t)*engD:int(t+1)*engD]...)
		}
	}
	return rows, nil
}

func (h *batchHost) rollback(id uint64, keep int) error {
	if keep > len(h.caches[id]) {
		return fmt.Errorf("rollback past the cache")
	}
	h.caches[id] = h.caches[id][:keep]
	h.backs++
	return nil
}

// hashDrafters are an n-gram drafter and a drafter of pseudo-random tokens
// that are a function of the context alone, so fresh copies propose the
// same in a single engine; fail (optional) may fail a call.
func hashDrafters(t *testing.T, ctx *Context, fail func(context []int32) error) []*Drafter {
	t.Helper()
	ngram, err := ctx.NewNgramDrafter(&NgramOptions{MaxN: 3})
	if err != nil {
		t.Fatal(err)
	}
	hash, err := ctx.NewCallbackDrafter(func(context []int32, k int) ([]int32, error) {
		if fail != nil {
			if err := fail(context); err != nil {
				return nil, err
			}
		}
		f := fnv.New64a()
		fmt.Fprint(f, context)
		r := rand.New(rand.NewSource(int64(f.Sum64())))
		out := make([]int32, k)
		for i := range out {
			out[i] = int32(r.Intn(engV))
		}
		return out, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ngram.Close(); hash.Close() })
	return []*Drafter{ngram, hash}
}

func newBatchFixture(t *testing.T, forward BatchTargetForward, h *batchHost, maxSequences int) (*Context, *LMHead, *BatchEngine) {
	t.Helper()
	ctx, err := NewContext(&ContextOptions{Backend: BackendCPU, Seed: 5, CPUThreads: 2, MaxRows: 64, MaxRequests: 8})
	if err != nil {
		t.Fatal(err)
	}
	head, err := ctx.NewLMHead(h.m.w, engV, engD)
	if err != nil {
		t.Fatal(err)
	}
	o := DefaultBatchEngineOptions()
	o.Rollback, o.NumDrafters, o.Arms, o.BanditSeed, o.MaxSequences = h.rollback, 2, batchArms, 5, maxSequences
	if forward == nil {
		forward = h.forward
	}
	e, err := ctx.NewBatchEngine(head, forward, &o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(); head.Close(); ctx.Close() })
	return ctx, head, e
}

func singleEngineTokens(t *testing.T, ctx *Context, head *LMHead, prompt []int32, g *GenerateOptions) []int32 {
	t.Helper()
	m := newModel(11)
	ds := hashDrafters(t, ctx, nil)
	o := DefaultEngineOptions()
	o.Drafters, o.BanditSeed = ds, 5
	for _, a := range batchArms {
		arm := Arm{DraftLen: a.DraftLen}
		if a.Drafter >= 0 {
			arm.Drafter = ds[a.Drafter]
		}
		o.Arms = append(o.Arms, arm)
	}
	e, err := ctx.NewEngine(head, m.forward, &o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tokens, _, err := e.Generate(prompt, g)
	if err != nil {
		t.Fatal(err)
	}
	return tokens
}

func TestBatchEngineEachSequenceEqualsItsSingleEngineRun(t *testing.T) {
	for _, temperature := range []float32{0, 0.9} {
		h := &batchHost{m: newModel(11), caches: map[uint64][]int32{}}
		ctx, head, e := newBatchFixture(t, nil, h, 0)
		budgets := map[uint64]int{11: 30, 22: 25, 1<<64 - 1: 20}
		streamed := map[uint64][]int32{}
		ids := []uint64{11, 22, 1<<64 - 1}
		add := func(id uint64) {
			err := e.AddSequence(id, batchPrompts[id], &SequenceOptions{Drafters: hashDrafters(t, ctx, nil),
				Temperature: temperature, Seed: 3, RequestID: id % 1000, MaxTokens: budgets[id],
				OnToken: func(s uint64, tok int32) bool { streamed[s] = append(streamed[s], tok); return false }})
			if err != nil {
				t.Fatal(err)
			}
		}
		add(ids[0])
		add(ids[1])
		for i := 0; i < 2; i++ {
			if n, err := e.Step(); n != 2 || err != nil {
				t.Fatalf("step: %d active, %v", n, err)
			}
		}
		add(ids[2]) // joins mid-run
		if err := e.Run(); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(e.SequenceIDs(), ids) || h.maxSize != 3 || h.backs == 0 {
			t.Fatalf("ids %v, largest forward %d, rollbacks %d", e.SequenceIDs(), h.maxSize, h.backs)
		}
		var steps uint64
		for _, id := range ids {
			s, err := e.Sequence(id)
			if err != nil {
				t.Fatal(err)
			}
			want := singleEngineTokens(t, ctx, head, batchPrompts[id], &GenerateOptions{Temperature: temperature, Seed: 3,
				RequestID: id % 1000, MaxTokens: budgets[id]})
			if temperature == 0 && !reflect.DeepEqual(want, h.m.greedy(t, batchPrompts[id], budgets[id])) {
				t.Fatalf("the single engine is not greedy decoding")
			}
			if !reflect.DeepEqual(s.Tokens, want) || !reflect.DeepEqual(streamed[id], want) || s.Active ||
				s.FinishReason != FinishLength || s.Err != nil {
				t.Fatalf("T = %g, sequence %d: %+v, want %v", temperature, id, s, want)
			}
			m, err := e.SequenceMetrics(id)
			if err != nil || m.Steps != uint64(s.Steps) || m.EmittedTokens != uint64(budgets[id]) || m.Arms != nil {
				t.Fatalf("sequence metrics %+v, %v", m, err)
			}
			steps += m.Steps
		}
		m, err := e.Metrics()
		if err != nil || m.Steps != steps || m.EmittedTokens != 75 || len(m.Arms) != len(batchArms) {
			t.Fatalf("metrics %+v, %v", m, err)
		}
		var pulls uint64
		for _, a := range m.Arms {
			pulls += a.Pulls
		}
		if pulls != m.Steps {
			t.Fatalf("arm pulls %d for %d steps", pulls, m.Steps)
		}
	}
}

func TestBatchEngineFailingSequenceCallbackEndsThatSequenceAlone(t *testing.T) {
	boom := errors.New("boom")
	for _, where := range []string{"draft callback", "token callback"} {
		h := &batchHost{m: newModel(11), caches: map[uint64][]int32{}}
		ctx, _, e := newBatchFixture(t, nil, h, 0)
		const failing = 22
		var count int
		for id, prompt := range batchPrompts {
			o := &SequenceOptions{MaxTokens: 25}
			var fail func([]int32) error
			if id == failing && where == "draft callback" {
				fail = func(c []int32) error {
					if len(c) > len(prompt)+5 {
						return boom
					}
					return nil
				}
			}
			if id == failing && where == "token callback" {
				o.OnToken = func(uint64, int32) bool {
					if count++; count >= 5 {
						panic(boom)
					}
					return false
				}
			}
			o.Drafters = hashDrafters(t, ctx, fail)
			if err := e.AddSequence(id, prompt, o); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Run(); err != nil {
			t.Fatal(err)
		}
		for id, prompt := range batchPrompts {
			s, err := e.Sequence(id)
			if err != nil {
				t.Fatal(err)
			}
			want := h.m.greedy(t, prompt, 25)
			if id != failing {
				if !reflect.DeepEqual(s.Tokens, want) || s.Err != nil || s.FinishReason != FinishLength {
					t.Fatalf("%s: sequence %d: %+v", where, id, s)
				}
				continue
			}
			var ce *CallbackError
			if !errors.As(s.Err, &ce) || !errors.Is(s.Err, ErrCallback) || ce.Callback != where || s.Active ||
				s.FinishReason != FinishNone || len(s.Tokens) == 0 || len(s.Tokens) >= 25 ||
				!reflect.DeepEqual(s.Tokens, want[:len(s.Tokens)]) {
				t.Fatalf("%s: the failing sequence: %+v", where, s)
			}
			if where == "draft callback" && !errors.Is(s.Err, boom) {
				t.Fatalf("the cause is lost: %v", s.Err)
			}
		}
	}
}

func TestBatchEngineFailingForwardFailsTheStepWhichIsRepeated(t *testing.T) {
	h := &batchHost{m: newModel(11), caches: map[uint64][]int32{}}
	calls := 0
	boom := errors.New("boom")
	ctx, _, e := newBatchFixture(t, func(c *BatchForwardCall) ([]float32, error) {
		if calls++; calls == 3 {
			return nil, boom
		}
		return h.forward(c)
	}, h, 0)
	for id, prompt := range batchPrompts {
		if err := e.AddSequence(id, prompt, &SequenceOptions{Drafters: hashDrafters(t, ctx, nil), MaxTokens: 20}); err != nil {
			t.Fatal(err)
		}
	}
	e.Step()
	e.Step()
	before := map[uint64][]int32{}
	for id := range batchPrompts {
		s, _ := e.Sequence(id)
		before[id] = s.Tokens
	}
	_, err := e.Step()
	var ce *CallbackError
	if !errors.As(err, &ce) || !errors.Is(err, boom) || !errors.Is(err, ErrCallback) || ce.Callback != "target forward" {
		t.Fatalf("step error %v", err)
	}
	for id, prompt := range batchPrompts {
		s, _ := e.Sequence(id)
		if !reflect.DeepEqual(s.Tokens, before[id]) {
			t.Fatalf("a failed step emitted tokens")
		}
		_ = prompt
	}
	if err := e.Run(); err != nil {
		t.Fatal(err)
	}
	for id, prompt := range batchPrompts {
		if s, _ := e.Sequence(id); !reflect.DeepEqual(s.Tokens, h.m.greedy(t, prompt, 20)) {
			t.Fatalf("sequence %d after the repeated step: %v", id, s.Tokens)
		}
	}
}

func TestBatchEngineBadInput(t *testing.T) {
	h := &batchHost{m: newModel(11), caches: map[uint64][]int32{}}
	ctx, head, e := newBatchFixture(t, nil, h, 2)
	if err := e.AddSequence(1, engPrompt, &SequenceOptions{Drafters: hashDrafters(t, ctx, nil), MaxTokens: 8}); err != nil {
		t.Fatal(err)
	}
	spare := hashDrafters(t, ctx, nil)
	logits, err := ctx.NewLogitsDrafter(func([]int32, int) ([]int32, []float32, error) { return nil, nil, nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer logits.Close()
	cases := []struct {
		name   string
		id     uint64
		prompt []int32
		o      SequenceOptions
		status Status
		arg    string
	}{
		{"token outside V", 2, []int32{engV}, SequenceOptions{Drafters: spare}, ErrOutOfRange, "prompt"},
		{"id in the engine", 1, engPrompt, SequenceOptions{Drafters: spare}, ErrInvalidArgument, "sequence_id"},
		{"drafter count", 2, engPrompt, SequenceOptions{Drafters: spare[:1]}, ErrOutOfRange, "num_drafters"},
		{"temperature", 2, engPrompt, SequenceOptions{Drafters: spare, Temperature: -1}, ErrInvalidArgument, "temperature"},
		{"stop token", 2, engPrompt, SequenceOptions{Drafters: spare, StopTokens: []int32{-1}}, ErrOutOfRange, "stop_tokens"},
		{"logits drafter", 2, engPrompt, SequenceOptions{Drafters: []*Drafter{spare[0], logits}}, ErrUnsupported, ""},
	}
	for _, c := range cases {
		o := c.o
		err := e.AddSequence(c.id, c.prompt, &o)
		var fe *Error
		if !errors.As(err, &fe) || fe.Status != c.status || !strings.Contains(fe.Message, c.arg) {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	if !reflect.DeepEqual(e.SequenceIDs(), []uint64{1}) || spare[0].batch != nil {
		t.Fatalf("a refused sequence changed the engine")
	}
	for _, err := range []error{e.RemoveSequence(99), func() error { _, err := e.Sequence(99); return err }(),
		func() error { _, err := e.SequenceMetrics(99); return err }()} {
		if !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("unknown id: %v", err)
		}
	}
	if err := e.AddSequence(2, engPrompt, &SequenceOptions{Drafters: spare, MaxTokens: 8}); err != nil {
		t.Fatal(err)
	}
	if err := spare[0].Close(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("closing a drafter in use: %v", err)
	}
	if err := e.AddSequence(3, engPrompt, &SequenceOptions{Drafters: hashDrafters(t, ctx, nil)}); !errors.Is(err, ErrWorkspaceExceeded) {
		t.Fatalf("max_sequences: %v", err)
	}
	var nested error
	if err := e.RemoveSequence(2); err != nil {
		t.Fatal(err)
	}
	if err := e.AddSequence(2, engPrompt, &SequenceOptions{Drafters: spare, MaxTokens: 8,
		OnToken: func(uint64, int32) bool { _, nested = e.Step(); return false }}); err != nil {
		t.Fatal(err)
	}
	if err := e.Run(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(nested, ErrInvalidArgument) {
		t.Fatalf("a nested Step: %v", nested)
	}
	for _, id := range []uint64{1, 2} {
		if s, _ := e.Sequence(id); !reflect.DeepEqual(s.Tokens, h.m.greedy(t, engPrompt, 8)) {
			t.Fatalf("sequence %d: %v", id, s.Tokens)
		}
	}
	bad := DefaultBatchEngineOptions()
	bad.Arms = []BatchArm{{0, 2}} // no drafter 0
	if _, err := ctx.NewBatchEngine(head, h.forward, &bad); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("arm without a drafter: %v", err)
	}
	if _, err := ctx.NewBatchEngine(head, nil, nil); !errors.Is(err, ErrNullPointer) {
		t.Fatalf("nil forward: %v", err)
	}
	if err := e.Close(); err != nil || spare[0].batch != nil {
		t.Fatalf("close: %v", err)
	}
	if _, err := e.Step(); err != errClosed {
		t.Fatalf("step after close: %v", err)
	}
}
