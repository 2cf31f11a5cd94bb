package flashspec

import (
	"errors"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"sync"
	"testing"
)

const engV, engD = 48, 16

var engPrompt = []int32{3, 17, 5, 3, 17}

// model is the synthetic target: a fixed random LM head W [V, d], and the
// hidden row after a context is E[its last token]. Its "KV cache" is the
// token list; forward and rollback fail on inconsistent bookkeeping.
type model struct {
	w, e      []float32
	cache     []int32
	rollbacks int
}

func newModel(seed int64) *model {
	r := rand.New(rand.NewSource(seed))
	return &model{w: randomRows(r, engV, engD), e: randomRows(r, engV, engD)}
}

func (m *model) forward(tokens []int32, numPast, numRows int) ([]float32, error) {
	if numPast > len(m.cache) || numRows < 1 || numRows > len(tokens) {
		return nil, fmt.Errorf("numPast %d, numRows %d with a cache of %d", numPast, numRows, len(m.cache))
	}
	m.cache = append(m.cache[:numPast], tokens...)
	rows := make([]float32, 0, numRows*engD)
	for _, t := range m.cache[len(m.cache)-numRows:] {
		rows = append(rows, m.e[int(t)*engD:int(t+1)*engD]...)
	}
	return rows, nil
}

func (m *model) rollback(numKeep int) error {
	if numKeep > len(m.cache) {
		return fmt.Errorf("rollback to %d beyond the cache of %d", numKeep, len(m.cache))
	}
	m.rollbacks++
	m.cache = m.cache[:numKeep]
	return nil
}

// greedy is plain greedy decoding in float64; it fails the test on a
// near-tie, where fp32 accumulation could flip a token.
func (m *model) greedy(t *testing.T, prompt []int32, n int) []int32 {
	t.Helper()
	last, out := prompt[len(prompt)-1], []int32{}
	for len(out) < n {
		best, second := -1, -1
		scores := make([]float64, engV)
		for v := 0; v < engV; v++ {
			for k := 0; k < engD; k++ {
				scores[v] += float64(m.e[int(last)*engD+k]) * float64(m.w[v*engD+k])
			}
			if best < 0 || scores[v] > scores[best] {
				best, second = v, best
			} else if second < 0 || scores[v] > scores[second] {
				second = v
			}
		}
		if scores[best]-scores[second] < 1e-3 {
			t.Fatalf("near-tie in the reference at token %d: pick another seed", len(out))
		}
		last = int32(best)
		out = append(out, last)
	}
	return out
}

func newEngineFixture(t *testing.T) (*Context, *LMHead, *model) {
	t.Helper()
	ctx, err := NewContext(&ContextOptions{Backend: BackendCPU, Seed: 5, CPUThreads: 2, MaxRows: 32})
	if err != nil {
		t.Fatal(err)
	}
	m := newModel(11)
	head, err := ctx.NewLMHead(m.w, engV, engD)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { head.Close(); ctx.Close() })
	return ctx, head, m
}

func checkMetrics(t *testing.T, m *EngineMetrics, tokens int) {
	t.Helper()
	if m.EmittedTokens != uint64(tokens) || m.AcceptedTokens > m.DraftTokens {
		t.Fatalf("metrics %+v for %d tokens", m, tokens)
	}
	var drafted, accepted, pulls, armDrafted, armAccepted uint64
	for j := range m.PositionDrafted {
		if m.PositionAccepted[j] > m.PositionDrafted[j] || j > 0 && (m.PositionDrafted[j] > m.PositionDrafted[j-1] || m.PositionAccepted[j] > m.PositionAccepted[j-1]) {
			t.Fatalf("position counts not monotone: %v %v", m.PositionDrafted, m.PositionAccepted)
		}
		drafted += m.PositionDrafted[j]
		accepted += m.PositionAccepted[j]
	}
	for _, a := range m.Arms {
		pulls += a.Pulls
		armDrafted += a.DraftTokens
		armAccepted += a.AcceptedTokens
	}
	if drafted != m.DraftTokens || accepted != m.AcceptedTokens || pulls != m.Steps || armDrafted != m.DraftTokens || armAccepted != m.AcceptedTokens {
		t.Fatalf("inconsistent metrics %+v", m)
	}
	if len(m.PositionDrafted) > 0 && m.PositionDrafted[0] != m.Drafts {
		t.Fatalf("drafts %d, position 0 drafted %d", m.Drafts, m.PositionDrafted[0])
	}
	if m.Steps == 0 || m.TokensPerStep != float64(m.EmittedTokens)/float64(m.Steps) || m.StepLatencyP50us <= 0 || m.StepLatencyP99us < m.StepLatencyP50us {
		t.Fatalf("metrics %+v", m)
	}
}

func TestEngineGreedyEqualsGreedyDecoding(t *testing.T) {
	ctx, head, m := newEngineFixture(t)
	ngram, err := ctx.NewNgramDrafter(&NgramOptions{MinN: 1, MaxN: 3})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(4))
	noise, err := ctx.NewCallbackDrafter(func(context []int32, k int) ([]int32, error) {
		d := make([]int32, k)
		for i := range d {
			d[i] = int32(r.Intn(engV))
		}
		return d, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := DefaultEngineOptions()
	o.Rollback = m.rollback
	o.Drafters = []*Drafter{ngram, noise}
	o.Arms = []Arm{{ngram, 2}, {ngram, 6}, {noise, 3}, {nil, 0}}
	o.TargetRowCost = 0.05
	engine, err := ctx.NewEngine(head, m.forward, &o)
	if err != nil {
		t.Fatal(err)
	}
	var streamed []int32
	tokens, reason, err := engine.Generate(engPrompt, &GenerateOptions{Seed: 9, MaxTokens: 60,
		OnToken: func(tok int32) bool { streamed = append(streamed, tok); return false }})
	if err != nil {
		t.Fatal(err)
	}
	want := m.greedy(t, engPrompt, 60)
	if !reflect.DeepEqual(tokens, want) || !reflect.DeepEqual(streamed, want) || reason != FinishLength {
		t.Fatalf("got %v (%v), streamed %v, want %v", tokens, reason, streamed, want)
	}
	if m.rollbacks == 0 {
		t.Fatal("the random drafter never had a draft rejected")
	}
	met, err := engine.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	checkMetrics(t, met, 60)
	if met.Steps >= 60 || len(met.Arms) != 4 || met.Arms[3].Drafter != -1 || met.Arms[2].Drafter != 1 || met.Arms[1].DraftLen != 6 {
		t.Fatalf("metrics %+v", met)
	}
	if err := engine.ResetMetrics(); err != nil {
		t.Fatal(err)
	}
	if met, _ := engine.Metrics(); met.Steps != 0 {
		t.Fatal("ResetMetrics kept", met.Steps)
	}
	if err := ngram.Close(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal("closing a drafter in use:", err)
	}
	if err := engine.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := engine.Generate(engPrompt, nil); err == nil {
		t.Fatal("Generate after Close")
	}
	engine.Cancel() // no-op once closed
	if err := ngram.Close(); err != nil {
		t.Fatal(err)
	}
	noise.Close()
}

func TestEnginePerfectDrafterAndLogitsDrafter(t *testing.T) {
	ctx, head, m := newEngineFixture(t)
	want := m.greedy(t, engPrompt, 40)
	oracle, err := ctx.NewCallbackDrafter(func(context []int32, k int) ([]int32, error) {
		done := len(context) - len(engPrompt)
		end := done + k
		if end > len(want) {
			end = len(want)
		}
		return want[done:end], nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := ctx.NewEngine(head, m.forward, &EngineOptions{Drafters: []*Drafter{oracle}, DefaultDraftLen: 4,
		Policy: PolicyFixed, TargetStepCost: 1})
	if err != nil {
		t.Fatal(err)
	}
	tokens, _, err := engine.Generate(engPrompt, &GenerateOptions{MaxTokens: 40})
	if err != nil || !reflect.DeepEqual(tokens, want) {
		t.Fatal(tokens, err)
	}
	met, _ := engine.Metrics()
	checkMetrics(t, met, 40)
	if met.AcceptanceRate != 1 || met.Steps != 8 || !reflect.DeepEqual(met.PositionAcceptance(), []float64{1, 1, 1, 1}) {
		t.Fatalf("a perfect drafter: %+v", met)
	}
	engine.Close()

	// A drafter that samples from its own (wrong) logits: still exact, so
	// greedy at T = 0.
	r := rand.New(rand.NewSource(8))
	sampler, err := ctx.NewLogitsDrafter(func(context []int32, k int) ([]int32, []float32, error) {
		if k > 3 {
			k = 3
		}
		tokens := make([]int32, k)
		logits := make([]float32, k*engV)
		for i := range tokens {
			tokens[i] = int32(r.Intn(engV))
			for v := 0; v < engV; v++ {
				logits[i*engV+v] = float32(r.NormFloat64())
			}
		}
		return tokens, logits, nil
	}, &CallbackDrafterOptions{DraftTemperature: 0.7})
	if err != nil {
		t.Fatal(err)
	}
	o := DefaultEngineOptions()
	o.Rollback, o.Drafters = m.rollback, []*Drafter{sampler}
	engine, err = ctx.NewEngine(head, m.forward, &o)
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	tokens, _, err = engine.Generate(engPrompt, &GenerateOptions{MaxTokens: 30})
	if err != nil || !reflect.DeepEqual(tokens, want[:30]) {
		t.Fatal(tokens, err)
	}
	if met, _ := engine.Metrics(); met.DraftTokens == 0 {
		t.Fatal("no drafts verified")
	}
}

type boom struct{ where string }

func (b *boom) Error() string { return b.where + " exploded" }

func TestEngineFailingCallbacks(t *testing.T) {
	for _, where := range []string{"target forward", "target rollback", "draft callback", "token callback", "panic"} {
		t.Run(strings.ReplaceAll(where, " ", "_"), func(t *testing.T) {
			ctx, head, m := newEngineFixture(t)
			want := m.greedy(t, engPrompt, 30)
			armed, calls := true, 0
			fail := func(name string) error {
				if armed && (name == where || where == "panic" && name == "draft callback") {
					if calls++; calls == 3 {
						if where == "panic" {
							panic("drafter panicked")
						}
						return &boom{name}
					}
				}
				return nil
			}
			r := rand.New(rand.NewSource(2))
			drafter, err := ctx.NewCallbackDrafter(func(context []int32, k int) ([]int32, error) {
				if err := fail("draft callback"); err != nil {
					return nil, err
				}
				d := make([]int32, k)
				for i := range d {
					d[i] = int32(r.Intn(engV)) // mostly rejected: rollbacks happen
				}
				return d, nil
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			o := DefaultEngineOptions()
			o.Drafters = []*Drafter{drafter}
			o.Rollback = func(numKeep int) error {
				if err := fail("target rollback"); err != nil {
					return err
				}
				return m.rollback(numKeep)
			}
			forward := func(tokens []int32, numPast, numRows int) ([]float32, error) {
				if err := fail("target forward"); err != nil {
					return nil, err
				}
				return m.forward(tokens, numPast, numRows)
			}
			engine, err := ctx.NewEngine(head, forward, &o)
			if err != nil {
				t.Fatal(err)
			}
			defer engine.Close()
			opts := &GenerateOptions{MaxTokens: 30, OnToken: func(int32) bool {
				if err := fail("token callback"); err != nil {
					panic(err) // a panic in OnToken is a failure too
				}
				return false
			}}
			tokens, _, err := engine.Generate(engPrompt, opts)
			var cb *CallbackError
			if !errors.As(err, &cb) || !errors.Is(err, ErrCallback) {
				t.Fatalf("want a *CallbackError, got %v", err)
			}
			var b *boom
			if where == "panic" {
				if !strings.Contains(err.Error(), "drafter panicked") || cb.Callback != "draft callback" {
					t.Fatal(err)
				}
			} else if where == "token callback" {
				if !strings.Contains(err.Error(), "exploded") || cb.Callback != where {
					t.Fatal(err)
				}
			} else if !errors.As(err, &b) || b.where != where || cb.Callback != where || !strings.Contains(cb.Message, where) {
				t.Fatalf("%v (callback %q, message %q)", err, cb.Callback, cb.Message)
			}
			if !reflect.DeepEqual(tokens, want[:len(tokens)]) {
				t.Fatal("tokens before the failure", tokens)
			}
			armed = false
			tokens, reason, err := engine.Generate(engPrompt, opts)
			if err != nil || reason != FinishLength || !reflect.DeepEqual(tokens, want) {
				t.Fatal("after the failure:", tokens, reason, err)
			}
		})
	}
}

func TestEngineStopsAndCancel(t *testing.T) {
	ctx, head, m := newEngineFixture(t)
	want := m.greedy(t, engPrompt, 40)
	ngram, _ := ctx.NewNgramDrafter(nil)
	o := DefaultEngineOptions()
	o.Rollback, o.Drafters = m.rollback, []*Drafter{ngram}
	engine, err := ctx.NewEngine(head, m.forward, &o)
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	index := func(tok int32) int {
		for i, x := range want {
			if x == tok {
				return i
			}
		}
		return -1
	}
	tokens, reason, err := engine.Generate(engPrompt, &GenerateOptions{MaxTokens: 40, StopTokens: []int32{want[7]}})
	if err != nil || reason != FinishStopToken || !reflect.DeepEqual(tokens, want[:index(want[7])+1]) {
		t.Fatal(tokens, reason, err)
	}
	tokens, reason, err = engine.Generate(engPrompt, &GenerateOptions{MaxTokens: 40, OnToken: func(tok int32) bool { return tok == want[4] }})
	if err != nil || reason != FinishHostStop || !reflect.DeepEqual(tokens, want[:index(want[4])+1]) {
		t.Fatal(tokens, reason, err)
	}
	n := 0
	tokens, reason, err = engine.Generate(engPrompt, &GenerateOptions{MaxTokens: 40, OnToken: func(int32) bool {
		if n++; n == 3 {
			engine.Cancel()
		}
		return false
	}})
	if !errors.Is(err, ErrCancelled) || reason != FinishCancelled || len(tokens) < 3 || !reflect.DeepEqual(tokens, want[:len(tokens)]) {
		t.Fatal(tokens, reason, err)
	}
	if err := engine.Close(); err != nil { // not from a callback: allowed
		t.Fatal(err)
	}

	// Cancel from another goroutine while the target forward blocks.
	ngram2, _ := ctx.NewNgramDrafter(nil)
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	slow := func(tokens []int32, numPast, numRows int) ([]float32, error) {
		once.Do(func() { close(started) })
		<-release
		return m.forward(tokens, numPast, numRows)
	}
	engine2, err := ctx.NewEngine(head, slow, &EngineOptions{Drafters: []*Drafter{ngram2}, DefaultDraftLen: 4, TargetStepCost: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer engine2.Close()
	done := make(chan error)
	go func() {
		_, _, err := engine2.Generate(engPrompt, &GenerateOptions{MaxTokens: 1000})
		done <- err
	}()
	<-started
	engine2.Cancel()
	if _, _, err := engine2.Generate(engPrompt, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal("a concurrent Generate:", err)
	}
	if err := engine2.Close(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal("Close while generating:", err)
	}
	close(release)
	if err := <-done; !errors.Is(err, ErrCancelled) {
		t.Fatal(err)
	}
}

func TestEngineBadInput(t *testing.T) {
	ctx, head, m := newEngineFixture(t)
	engine, err := ctx.NewEngine(head, m.forward, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	if _, _, err := engine.Generate([]int32{engV}, nil); !errors.Is(err, ErrOutOfRange) || !strings.Contains(err.Error(), "prompt") {
		t.Fatal(err)
	}
	if _, _, err := engine.Generate(engPrompt, &GenerateOptions{Temperature: -1}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal(err)
	}
	wide, _ := ctx.NewEngine(head, func(tokens []int32, numPast, numRows int) ([]float32, error) {
		return make([]float32, numRows*(engD+1)), nil
	}, nil)
	defer wide.Close()
	if _, _, err := wide.Generate(engPrompt, nil); !errors.Is(err, ErrCallback) {
		t.Fatal(err)
	}
	if _, err := ctx.NewNgramDrafter(&NgramOptions{MinN: 5, MaxN: 2}); !errors.Is(err, ErrOutOfRange) {
		t.Fatal(err)
	}
	o := DefaultEngineOptions()
	o.Policy = PolicyOracle
	if _, err := ctx.NewEngine(head, m.forward, &o); !errors.Is(err, ErrNullPointer) || !strings.Contains(err.Error(), "oracle_rewards") {
		t.Fatal(err)
	}
	o.OracleRewards = []float64{1}
	oracle, err := ctx.NewEngine(head, m.forward, &o)
	if err != nil {
		t.Fatal(err)
	}
	oracle.Close()
}
