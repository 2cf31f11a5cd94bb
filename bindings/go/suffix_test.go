package flashspec

import (
	"errors"
	"math"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// The suffix drafter and the draft length rule on the synthetic target of
// engine_test.go: at T = 0 the engines emit plain greedy decoding with them;
// the options reach the library (the adaptive rule stops drafting for a
// drafter that is never right, the cache of earlier outputs shortens a
// repeated generation); ProposeTree's trees have the documented shape; bad
// input gets the library's statuses.

// noiseDrafter proposes random tokens: almost always rejected.
func noiseDrafter(t *testing.T, ctx *Context, seed int64) *Drafter {
	t.Helper()
	r := rand.New(rand.NewSource(seed))
	d, err := ctx.NewCallbackDrafter(func(context []int32, k int) ([]int32, error) {
		out := make([]int32, k)
		for i := range out {
			out[i] = int32(r.Intn(engV))
		}
		return out, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func newSuffixDrafter(t *testing.T, ctx *Context, o *SuffixOptions) *Drafter {
	t.Helper()
	d, err := ctx.NewSuffixDrafter(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestSuffixDrafterAndAdaptiveDraftLenEqualGreedyDecoding(t *testing.T) {
	ctx, head, m := newEngineFixture(t)
	want := m.greedy(t, engPrompt, 60)
	for _, rule := range []DraftLenRule{DraftLenArm, DraftLenAdaptive} {
		so := DefaultSuffixOptions()
		so.MaxDepth, so.MinProbability, so.CacheMaxTokens = 8, 0.2, 256
		suffix := newSuffixDrafter(t, ctx, &so)
		noise := noiseDrafter(t, ctx, 3)
		o := DefaultEngineOptions()
		o.Rollback = m.rollback
		o.Drafters = []*Drafter{suffix, noise}
		o.Arms = []Arm{{suffix, 6}, {noise, 3}, {nil, 0}}
		o.DraftLenRule = rule
		engine, err := ctx.NewEngine(head, m.forward, &o)
		if err != nil {
			t.Fatal(err)
		}
		for run := 0; run < 2; run++ { // the second run also drafts from the first one's output
			m.cache = nil
			tokens, reason, err := engine.Generate(engPrompt, &GenerateOptions{Seed: 9, MaxTokens: 60})
			if err != nil || reason != FinishLength || !reflect.DeepEqual(tokens, want) {
				t.Fatalf("rule %d, run %d: %v (%v, %v), want %v", rule, run, tokens, reason, err, want)
			}
			met, err := engine.Metrics()
			if err != nil {
				t.Fatal(err)
			}
			checkMetrics(t, met, 60*(run+1))
			if met.Arms[0].AcceptedTokens == 0 {
				t.Fatalf("rule %d: the suffix drafter never had a token accepted: %+v", rule, met.Arms[0])
			}
		}
		if err := engine.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// runFixedArm generates n greedy tokens with one arm (drafter, k) and
// returns the metrics.
func runFixedArm(t *testing.T, ctx *Context, head *LMHead, m *model, d *Drafter, k int, rule DraftLenRule, n int) *EngineMetrics {
	t.Helper()
	o := DefaultEngineOptions()
	o.Rollback = m.rollback
	o.Drafters = []*Drafter{d}
	o.Arms = []Arm{{d, k}}
	o.Policy = PolicyFixed
	o.DraftLenRule = rule
	o.TargetRowCost = 0.1 // a draft token costs enough that one never accepted is not worth drafting
	engine, err := ctx.NewEngine(head, m.forward, &o)
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	m.cache = nil
	tokens, _, err := engine.Generate(engPrompt, &GenerateOptions{MaxTokens: n})
	if err != nil || !reflect.DeepEqual(tokens, m.greedy(t, engPrompt, n)) {
		t.Fatalf("rule %d: %v, %v", rule, tokens, err)
	}
	met, err := engine.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	return met
}

func TestDraftLenRuleReachesTheEngine(t *testing.T) {
	ctx, head, m := newEngineFixture(t)
	// A drafter that is never right: the arm rule drafts k every step, the
	// adaptive one soon stops asking it.
	fixed := runFixedArm(t, ctx, head, m, noiseDrafter(t, ctx, 7), 6, DraftLenArm, 80)
	adaptive := runFixedArm(t, ctx, head, m, noiseDrafter(t, ctx, 7), 6, DraftLenAdaptive, 80)
	if adaptive.DraftTokens*4 > fixed.DraftTokens || adaptive.Drafts*2 > adaptive.Steps {
		t.Fatalf("arm rule: %d draft tokens in %d steps; adaptive: %d in %d steps (%d drafts)",
			fixed.DraftTokens, fixed.Steps, adaptive.DraftTokens, adaptive.Steps, adaptive.Drafts)
	}
}

func TestSuffixDrafterCacheShortensARepeatedGeneration(t *testing.T) {
	ctx, head, m := newEngineFixture(t)
	suffix := newSuffixDrafter(t, ctx, nil)
	first := runFixedArm(t, ctx, head, m, suffix, 8, DraftLenArm, 40)
	second := runFixedArm(t, ctx, head, m, suffix, 8, DraftLenArm, 40)
	// Without a cache the second generation drafts as the first did.
	so := DefaultSuffixOptions()
	so.CacheMaxTokens = 0
	forgetful := newSuffixDrafter(t, ctx, &so)
	third := runFixedArm(t, ctx, head, m, forgetful, 8, DraftLenArm, 40)
	fourth := runFixedArm(t, ctx, head, m, forgetful, 8, DraftLenArm, 40)
	if second.Steps >= first.Steps || fourth.Steps != third.Steps || third.Steps != first.Steps {
		t.Fatalf("steps: cached %d then %d; without a cache %d then %d", first.Steps, second.Steps, third.Steps, fourth.Steps)
	}
}

// checkTree checks ProposeTree's documented shape: parents before
// children, no two children of a node with the same token, and each path
// from the root, after the context's last token, a run of tokens the
// context holds (the drafter proposes only what it has indexed).
func checkTree(t *testing.T, context, tokens, parents []int32) {
	t.Helper()
	if len(tokens) != len(parents) {
		t.Fatalf("%d tokens, %d parents", len(tokens), len(parents))
	}
	type edge struct{ parent, token int32 }
	seen := map[edge]bool{}
	text := func(s []int32) string {
		b := make([]byte, 0, 4*len(s))
		for _, v := range s {
			b = append(b, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
		}
		return string(b)
	}
	for i, p := range parents {
		if p < -1 || int(p) >= i {
			t.Fatalf("node %d has parent %d: %v", i, p, parents)
		}
		if seen[edge{p, tokens[i]}] {
			t.Fatalf("node %d repeats token %d among its siblings", i, tokens[i])
		}
		seen[edge{p, tokens[i]}] = true
		path := []int32{tokens[i]}
		for q := p; q >= 0; q = parents[q] {
			path = append([]int32{tokens[q]}, path...)
		}
		path = append([]int32{context[len(context)-1]}, path...)
		if !strings.Contains(text(context), text(path)) {
			t.Fatalf("node %d's path %v does not occur in the context %v", i, path, context)
		}
	}
}

func TestSuffixDrafterProposeTree(t *testing.T) {
	ctx, _, _ := newEngineFixture(t)
	so := DefaultSuffixOptions()
	so.MaxMatchLen, so.MaxDepth, so.MinProbability = 1, 2, 0
	suffix := newSuffixDrafter(t, ctx, &so)
	context := []int32{5, 1, 5, 2, 5, 3, 5}
	tokens, parents, err := suffix.ProposeTree(context, 3)
	if err != nil {
		t.Fatal(err)
	}
	// After 5 came 1, 2 and 3 once each: three children of the root, equally likely.
	if len(tokens) != 3 || !reflect.DeepEqual(parents, []int32{-1, -1, -1}) {
		t.Fatalf("%v %v", tokens, parents)
	}
	checkTree(t, context, tokens, parents)
	big, bigParents, err := suffix.ProposeTree(context, 8)
	if err != nil {
		t.Fatal(err)
	}
	if len(big) <= 3 || len(big) > 8 || !reflect.DeepEqual(big[:3], tokens) || !reflect.DeepEqual(bigParents[:3], parents) {
		t.Fatalf("budget 8: %v %v; budget 3: %v %v", big, bigParents, tokens, parents)
	}
	checkTree(t, context, big, bigParents)
	// A longer, repetitive context: a deeper tree, still of the same shape.
	so = DefaultSuffixOptions()
	deep := newSuffixDrafter(t, ctx, &so)
	r := rand.New(rand.NewSource(2))
	long := make([]int32, 0, 400)
	for len(long) < 400 {
		phrase := [][]int32{{7, 8, 9, 10}, {7, 8, 11}, {3, 4}}[r.Intn(3)]
		long = append(long, phrase...)
	}
	long = append(long, 7)
	tokens, parents, err = deep.ProposeTree(long, MaxDraftLen)
	if err != nil {
		t.Fatal(err)
	}
	if len(tokens) < 3 || tokens[0] != 8 || parents[0] != -1 {
		t.Fatalf("after 7 comes 8: %v %v", tokens, parents)
	}
	checkTree(t, long, tokens, parents)
	for _, n := range []int{0, 1, 5} {
		sub, subParents, err := deep.ProposeTree(long, n)
		if err != nil || len(sub) != n || !reflect.DeepEqual(sub, tokens[:n]) || !reflect.DeepEqual(subParents, parents[:n]) {
			t.Fatalf("budget %d: %v %v (%v), not the first nodes of %v %v", n, sub, subParents, err, tokens, parents)
		}
	}
	// No match: no nodes.
	none, noneParents, err := deep.ProposeTree([]int32{40, 41, 42}, 4)
	if err != nil || len(none) != 0 || len(noneParents) != 0 {
		t.Fatalf("%v %v %v", none, noneParents, err)
	}
}

func TestSuffixDrafterAndDraftLenBadInput(t *testing.T) {
	ctx, head, m := newEngineFixture(t)
	withOptions := func(change func(*SuffixOptions)) *SuffixOptions {
		o := DefaultSuffixOptions()
		change(&o)
		return &o
	}
	cases := []struct {
		name   string
		o      *SuffixOptions
		status Status
		arg    string
	}{
		{"match length 0", withOptions(func(o *SuffixOptions) { o.MaxMatchLen = 0 }), ErrOutOfRange, "params->max_match_len"},
		{"match length 65", withOptions(func(o *SuffixOptions) { o.MaxMatchLen = 65 }), ErrOutOfRange, "params->max_match_len"},
		{"depth 0", withOptions(func(o *SuffixOptions) { o.MaxDepth = 0 }), ErrOutOfRange, "params->max_depth"},
		{"depth wraps to 1", withOptions(func(o *SuffixOptions) { o.MaxDepth = 1<<32 + 1 }), ErrOutOfRange, "MaxDepth"},
		{"probability 1.5", withOptions(func(o *SuffixOptions) { o.MinProbability = 1.5 }), ErrOutOfRange, "params->min_probability"},
		{"probability NaN", withOptions(func(o *SuffixOptions) { o.MinProbability = math.NaN() }), ErrOutOfRange, "params->min_probability"},
		{"cache -1", withOptions(func(o *SuffixOptions) { o.CacheMaxTokens = -1 }), ErrOutOfRange, "params->cache_max_tokens"},
		{"cache 2^24 + 1", withOptions(func(o *SuffixOptions) { o.CacheMaxTokens = 1<<24 + 1 }), ErrOutOfRange, "params->cache_max_tokens"},
		{"call cost", withOptions(func(o *SuffixOptions) { o.CallCost = -1 }), ErrInvalidArgument, "params->call_cost"},
		{"token cost", withOptions(func(o *SuffixOptions) { o.TokenCost = math.Inf(1) }), ErrInvalidArgument, "params->token_cost"},
	}
	for _, c := range cases {
		d, err := ctx.NewSuffixDrafter(c.o)
		var fe *Error
		if d != nil || !errors.As(err, &fe) || fe.Status != c.status || !strings.Contains(fe.Message, c.arg) {
			t.Fatalf("%s: %v, %v", c.name, d, err)
		}
	}

	suffix := newSuffixDrafter(t, ctx, nil)
	ngram, err := ctx.NewNgramDrafter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ngram.Close()
	trees := []struct {
		name    string
		d       *Drafter
		context []int32
		max     int
		status  Status
		arg     string
	}{
		{"empty context", suffix, nil, 4, ErrOutOfRange, "context_len"},
		{"negative token", suffix, []int32{1, -2, 3}, 4, ErrOutOfRange, "context"},
		{"budget -1", suffix, []int32{1, 2}, -1, ErrOutOfRange, "maxNodes"},
		{"budget past the limit", suffix, []int32{1, 2}, MaxDraftLen + 1, ErrOutOfRange, "maxNodes"},
		{"not a suffix drafter", ngram, []int32{1, 2}, 4, ErrInvalidArgument, "suffix"},
	}
	for _, c := range trees {
		tokens, parents, err := c.d.ProposeTree(c.context, c.max)
		var fe *Error
		if tokens != nil || parents != nil || !errors.As(err, &fe) || fe.Status != c.status || !strings.Contains(fe.Message, c.arg) {
			t.Fatalf("%s: %v %v %v", c.name, tokens, parents, err)
		}
	}
	// A drafter serving a batched engine's sequence keeps its index.
	h := &batchHost{m: m, caches: map[uint64][]int32{}}
	bo := DefaultBatchEngineOptions()
	bo.NumDrafters, bo.Arms = 1, []BatchArm{{0, 4}}
	batch, err := ctx.NewBatchEngine(head, h.forward, &bo)
	if err != nil {
		t.Fatal(err)
	}
	defer batch.Close()
	serving := newSuffixDrafter(t, ctx, nil)
	if err := batch.AddSequence(1, engPrompt, &SequenceOptions{Drafters: []*Drafter{serving}, MaxTokens: 4}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := serving.ProposeTree(engPrompt, 4); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "batched engine") {
		t.Fatalf("a drafter serving a sequence: %v", err)
	}
	closed := newSuffixDrafter(t, ctx, nil)
	closed.Close()
	if _, _, err := closed.ProposeTree(engPrompt, 4); err != errClosed {
		t.Fatalf("a closed drafter: %v", err)
	}

	// The draft length options of both engines.
	for _, c := range []struct {
		name   string
		rule   DraftLenRule
		memory float64
		arg    string
	}{
		{"unknown rule", DraftLenRule(5), 0, "params->draft_len_rule"},
		{"rule wraps to ARM", DraftLenRule(1 << 32), 0, "DraftLenRule"},
		{"memory 0.5", DraftLenAdaptive, 0.5, "params->draft_len_memory"},
		{"memory NaN", DraftLenAdaptive, math.NaN(), "params->draft_len_memory"},
		{"memory 2e6", DraftLenArm, 2e6, "params->draft_len_memory"},
	} {
		o := DefaultEngineOptions()
		o.DraftLenRule, o.DraftLenMemory = c.rule, c.memory
		_, err := ctx.NewEngine(head, m.forward, &o)
		b := DefaultBatchEngineOptions()
		b.DraftLenRule, b.DraftLenMemory = c.rule, c.memory
		_, berr := ctx.NewBatchEngine(head, h.forward, &b)
		for _, err := range []error{err, berr} {
			if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), c.arg) {
				t.Fatalf("%s: %v", c.name, err)
			}
		}
	}
	if o, b := DefaultEngineOptions(), DefaultBatchEngineOptions(); o.DraftLenRule != DraftLenArm || o.DraftLenMemory != 64 ||
		b.DraftLenRule != DraftLenArm || b.DraftLenMemory != 64 {
		t.Fatalf("defaults: %+v %+v", o, b)
	}
}

// runBatch runs batchPrompts to n tokens each at T = 0 in one batched
// engine with options o, each sequence bringing the drafters that
// drafters(ctx, id) creates on the engine's context; it checks every sequence against greedy decoding and returns the
// engine's metrics.
func runBatch(t *testing.T, o BatchEngineOptions, drafters func(ctx *Context, id uint64) []*Drafter, n int) *EngineMetrics {
	t.Helper()
	m := newModel(11)
	h := &batchHost{m: m, caches: map[uint64][]int32{}}
	ctx, err := NewContext(&ContextOptions{Backend: BackendCPU, Seed: 5, CPUThreads: 2, MaxRows: 64, MaxRequests: 8})
	if err != nil {
		t.Fatal(err)
	}
	head, err := ctx.NewLMHead(m.w, engV, engD)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { head.Close(); ctx.Close() }) // after the drafters' cleanups
	o.Rollback = h.rollback
	engine, err := ctx.NewBatchEngine(head, h.forward, &o)
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	for id, prompt := range batchPrompts {
		if err := engine.AddSequence(id, prompt, &SequenceOptions{Drafters: drafters(ctx, id), MaxTokens: n}); err != nil {
			t.Fatal(err)
		}
	}
	if err := engine.Run(); err != nil {
		t.Fatal(err)
	}
	for id, prompt := range batchPrompts {
		s, err := engine.Sequence(id)
		if err != nil || s.Err != nil || s.FinishReason != FinishLength || !reflect.DeepEqual(s.Tokens, m.greedy(t, prompt, n)) {
			t.Fatalf("sequence %d: %+v, %v", id, s, err)
		}
	}
	met, err := engine.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	return met
}

func TestBatchEngineSuffixDrafterAndDraftLenRule(t *testing.T) {
	// Each sequence's suffix drafter, beside a noise drafter, under the
	// adaptive rule: greedy decoding, in fewer steps than tokens.
	o := DefaultBatchEngineOptions()
	o.NumDrafters, o.Arms, o.DraftLenRule, o.DraftLenMemory = 2, []BatchArm{{0, 6}, {1, 6}, {-1, 0}}, DraftLenAdaptive, 16
	met := runBatch(t, o, func(ctx *Context, id uint64) []*Drafter {
		return []*Drafter{newSuffixDrafter(t, ctx, nil), noiseDrafter(t, ctx, int64(id%97))}
	}, 40)
	if met.Steps >= 40*uint64(len(batchPrompts)) || met.Arms[0].AcceptedTokens == 0 {
		t.Fatalf("the suffix drafter did not help: %+v", met)
	}
	// A drafter that is never right: the arm rule drafts k = 6 every step,
	// the adaptive one soon stops asking it.
	drafted := map[DraftLenRule]uint64{}
	for _, rule := range []DraftLenRule{DraftLenArm, DraftLenAdaptive} {
		o := DefaultBatchEngineOptions()
		o.NumDrafters, o.Arms, o.Policy, o.DraftLenRule, o.TargetRowCost = 1, []BatchArm{{0, 6}}, PolicyFixed, rule, 0.1
		met := runBatch(t, o, func(ctx *Context, id uint64) []*Drafter {
			return []*Drafter{noiseDrafter(t, ctx, int64(id%97))}
		}, 60)
		drafted[rule] = met.DraftTokens
	}
	if drafted[DraftLenAdaptive]*4 > drafted[DraftLenArm] {
		t.Fatalf("draft tokens: arm rule %d, adaptive %d", drafted[DraftLenArm], drafted[DraftLenAdaptive])
	}
}
