package flashspec_test

import (
	"errors"
	"fmt"

	flashspec "github.com/flashspec/flashspec/bindings/go"
)

// The suffix-drafter snippet of bindings/README.md (Go section): an engine
// drafting with it under the adaptive draft length rule, its cache of
// earlier outputs at work, and a draft tree for a host that verifies trees.
func ExampleContext_NewSuffixDrafter() {
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
	var cache []int32 // the target's KV cache, as tokens
	forward := func(tokens []int32, numPast, numRows int) ([]float32, error) {
		cache = append(cache[:numPast], tokens...)
		var rows []float32
		for _, t := range cache[len(cache)-numRows:] {
			rows = append(rows, e[int(t)*D:int(t+1)*D]...)
		}
		return rows, nil
	}

	so := flashspec.DefaultSuffixOptions() // every field is passed as is: start from the defaults
	so.MaxDepth = 8
	suffix, err := ctx.NewSuffixDrafter(&so)
	if err != nil {
		panic(err)
	}
	defer suffix.Close()
	o := flashspec.DefaultEngineOptions()
	o.Drafters = []*flashspec.Drafter{suffix}
	o.Arms = []flashspec.Arm{{Drafter: suffix, DraftLen: 8}}
	o.DraftLenRule = flashspec.DraftLenAdaptive // k ≤ 8 from live acceptance estimates
	engine, err := ctx.NewEngine(head, forward, &o)
	if err != nil {
		panic(err)
	}
	for run := 1; run <= 2; run++ { // the second run also drafts from the first one's output
		tokens, _, err := engine.Generate([]int32{0}, &flashspec.GenerateOptions{Temperature: 0, MaxTokens: 12})
		if err != nil {
			panic(err)
		}
		m, _ := engine.Metrics()
		fmt.Println("run", run, tokens, "steps:", m.Steps)
		engine.ResetMetrics()
	}
	engine.Close() // releases the drafter

	// A draft tree, best node first; parents[i] < i, -1 for the root's
	// children. After "6 4" came 5 and 7: two branches.
	tokens, parents, err := suffix.ProposeTree([]int32{6, 4, 5, 6, 4, 7, 6, 4}, 6)
	if err != nil {
		panic(err)
	}
	fmt.Println("tree:", tokens, parents)
	_, _, err = suffix.ProposeTree([]int32{6, 4}, flashspec.MaxDraftLen+1) // refused before the call
	fmt.Println(err)
	_, _, err = suffix.ProposeTree([]int32{6, -1}, 4) // the library's refusal
	fmt.Println(errors.Is(err, flashspec.ErrOutOfRange))
	// Output:
	// run 1 [1 2 3 0 1 2 3 0 1 2 3 0] steps: 6
	// run 2 [1 2 3 0 1 2 3 0 1 2 3 0] steps: 2
	// tree: [5 6 4 7 6 4] [-1 0 1 -1 3 4]
	// FLASHSPEC_ERR_OUT_OF_RANGE: maxNodes: must be in [0, 1023], got 1024
	// true
}
