package flashspec_test

import (
	"errors"
	"fmt"
	"math/rand"

	flashspec "github.com/flashspec/flashspec/bindings/go"
)

// The engine snippet of bindings/README.md (Go section): the n-gram drafter
// over a synthetic target model whose hidden row is an embedding of the
// last token; at temperature 0 the output equals greedy decoding.
func ExampleEngine() {
	const V, D = 32, 8
	r := rand.New(rand.NewSource(1))
	w, e := make([]float32, V*D), make([]float32, V*D) // LM head; hidden row = e[last token]
	for i := range w {
		w[i], e[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
	}
	ctx, err := flashspec.NewContext(&flashspec.ContextOptions{Backend: flashspec.BackendCPU})
	if err != nil {
		panic(err)
	}
	defer ctx.Close()
	head, err := ctx.NewLMHead(w, V, D)
	if err != nil {
		panic(err)
	}
	defer head.Close()

	var cache []int32 // the target's KV cache, as tokens
	forward := func(tokens []int32, numPast, numRows int) ([]float32, error) {
		cache = append(cache[:numPast], tokens...)
		var rows []float32
		for _, t := range cache[len(cache)-numRows:] {
			rows = append(rows, e[int(t)*D:int(t+1)*D]...)
		}
		return rows, nil
	}
	ngram, err := ctx.NewNgramDrafter(&flashspec.NgramOptions{MaxN: 3})
	if err != nil {
		panic(err)
	}
	defer ngram.Close()
	o := flashspec.DefaultEngineOptions()
	o.Rollback = func(numKeep int) error { cache = cache[:numKeep]; return nil }
	o.Drafters = []*flashspec.Drafter{ngram}
	o.Arms = []flashspec.Arm{{Drafter: ngram, DraftLen: 2}, {Drafter: ngram, DraftLen: 4}, {DraftLen: 0}}
	engine, err := ctx.NewEngine(head, forward, &o)
	if err != nil {
		panic(err)
	}
	defer engine.Close()

	tokens, reason, err := engine.Generate([]int32{1, 2, 3}, &flashspec.GenerateOptions{Temperature: 0, MaxTokens: 24})
	if err != nil {
		panic(err)
	}
	metrics, err := engine.Metrics()
	if err != nil {
		panic(err)
	}
	greedy, last := true, int32(3)
	for _, t := range tokens { // plain greedy decoding: argmax over v of w[v] · e[last]
		best, bestScore := 0, -1e300
		for v := 0; v < V; v++ {
			score := 0.0
			for k := 0; k < D; k++ {
				score += float64(w[v*D+k]) * float64(e[int(last)*D+k])
			}
			if score > bestScore {
				best, bestScore = v, score
			}
		}
		greedy, last = greedy && t == int32(best), t
	}
	fmt.Println(len(tokens), reason, greedy, metrics.EmittedTokens, metrics.Steps < 24)

	// A failing callback fails the call with a *CallbackError wrapping its
	// error; the engine stays usable.
	errNoCache := errors.New("no KV cache")
	broken, _ := ctx.NewEngine(head, func([]int32, int, int) ([]float32, error) { return nil, errNoCache }, nil)
	defer broken.Close()
	_, _, err = broken.Generate([]int32{1, 2, 3}, nil)
	fmt.Println(errors.Is(err, flashspec.ErrCallback), errors.Is(err, errNoCache))
	// Output:
	// 24 length true 24 true
	// true true
}
