package flashspec_test

import (
	"errors"
	"fmt"

	flashspec "github.com/flashspec/flashspec/bindings/go"
)

// The batched-engine snippet of bindings/README.md (Go section): two
// sequences share each target forward; a third whose drafter fails ends
// alone.
func ExampleBatchEngine() {
	const V, D = 4, 2
	w := []float32{1, 0, 0, 1, -1, 0, 0, -1} // LM head [V, d]
	e := []float32{0, 1, -1, 0, 0, -1, 1, 0} // hidden row = e[last token]: greedy cycles 0 → 1 → 2 → 3 → 0
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

	caches := map[uint64][]int32{} // one KV cache per sequence id
	forward := func(c *flashspec.BatchForwardCall) ([]float32, error) {
		var rows []float32
		for s, id := range c.SequenceIDs {
			caches[id] = append(caches[id][:c.NumPast[s]], c.TokensOf(s)...)
			for _, t := range caches[id][len(caches[id])-c.RowsOf(s):] {
				rows = append(rows, e[int(t)*D:int(t+1)*D]...)
			}
		}
		return rows, nil
	}
	var drafters []*flashspec.Drafter // one n-gram drafter per sequence
	defer func() {
		for _, d := range drafters { // after engine.Close (deferred later, runs first)
			d.Close()
		}
	}()
	o := flashspec.DefaultBatchEngineOptions()
	o.NumDrafters = 1
	o.Arms = []flashspec.BatchArm{{Drafter: 0, DraftLen: 3}, {Drafter: -1, DraftLen: 0}}
	engine, err := ctx.NewBatchEngine(head, forward, &o)
	if err != nil {
		panic(err)
	}
	defer engine.Close()
	for id, prompt := range map[uint64][]int32{7: {0}, 8: {2, 3}} {
		ngram, err := ctx.NewNgramDrafter(nil)
		if err != nil {
			panic(err)
		}
		drafters = append(drafters, ngram)
		if err := engine.AddSequence(id, prompt, &flashspec.SequenceOptions{Drafters: []*flashspec.Drafter{ngram}, MaxTokens: 8}); err != nil {
			panic(err)
		}
	}
	if err := engine.Run(); err != nil {
		panic(err)
	}
	for _, id := range []uint64{7, 8} {
		s, _ := engine.Sequence(id)
		fmt.Println(id, s.Tokens, s.FinishReason, s.Err)
	}

	// A sequence's failing drafter ends that sequence alone.
	errNoModel := errors.New("no draft model")
	broken, _ := ctx.NewCallbackDrafter(func([]int32, int) ([]int32, error) { return nil, errNoModel }, nil)
	drafters = append(drafters, broken)
	engine.AddSequence(9, []int32{1}, &flashspec.SequenceOptions{Drafters: []*flashspec.Drafter{broken}})
	engine.Run()
	s, _ := engine.Sequence(9)
	fmt.Println(s.Active, errors.Is(s.Err, flashspec.ErrCallback), errors.Is(s.Err, errNoModel))
	// Output:
	// 7 [1 2 3 0 1 2 3 0] length <nil>
	// 8 [0 1 2 3 0 1 2 3] length <nil>
	// false true true
}
