package flashspec_test

import (
	"errors"
	"fmt"

	flashspec "github.com/flashspec/flashspec/bindings/go"
)

// The sparse-supports snippet of bindings/README.md (Go section): a tree of
// stochastic candidates, each with the top-k q its drafter sampled it from,
// verified at T = 0 (the argmax walk) and T = 1; a short support slice is
// refused before the call, a q not summing to 1 by the library.
func ExampleContext_VerifyAndFinalize_sparseSupports() {
	ctx, err := flashspec.NewContext(&flashspec.ContextOptions{Backend: flashspec.BackendCPU, Seed: 3})
	if err != nil {
		panic(err)
	}
	defer ctx.Close()
	w := []float32{1, 0, 0, 1, -1, 0, 0, -1, 1, 1, -1, -1} // V = 6 tokens, d = 2
	head, err := ctx.NewLMHead(w, 6, 2)
	if err != nil {
		panic(err)
	}
	defer head.Close()

	// Nodes 0 and 1 are candidates after the root, node 2 a child of node 0.
	// Draft row k's q: tokens [offsets[k], offsets[k+1]) with their probabilities.
	batch := &flashspec.VerifyBatch{
		DraftOffsets:        []int32{0, 3},
		DraftTokens:         []int32{4, 0, 1},
		DraftParents:        []int32{-1, -1, 0},
		TargetHidden:        []float32{3, 1, -1, 2, 2, -3, -2, 1},
		Temperatures:        []float32{0},
		DraftSupportOffsets: []int32{0, 2, 4, 7},
		DraftSupportTokens:  []int32{4, 0, 0, 4, 1, 3, 5},
		DraftSupportProbs:   []float32{0.75, 0.25, 0.5, 0.5, 0.5, 0.25, 0.25},
	}
	greedy, err := ctx.VerifyAndFinalize(head, batch)
	if err != nil {
		panic(err)
	}
	fmt.Println("T = 0:", greedy.Tokens(0), "path:", greedy.Nodes(0))
	batch.Temperatures = []float32{1}
	sampled, err := ctx.VerifyAndFinalize(head, batch)
	if err != nil {
		panic(err)
	}
	fmt.Println("T = 1:", sampled.Tokens(0), "path:", sampled.Nodes(0)) // the same tokens for the same seed

	// Fewer probabilities than the last offset says: refused before the call.
	short := *batch
	short.DraftSupportProbs = batch.DraftSupportProbs[:6]
	_, err = ctx.VerifyAndFinalize(head, &short)
	fmt.Println(err)
	// A row of q that does not sum to 1: the library's error, naming the array.
	bad := *batch
	bad.DraftSupportProbs = []float32{0.75, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25}
	_, err = ctx.VerifyAndFinalize(head, &bad)
	fmt.Println(errors.Is(err, flashspec.ErrInvalidArgument), err.(*flashspec.Error).Message[:26])
	// Output:
	// T = 0: [4 1 2] path: [0 2]
	// T = 1: [4 1 5] path: [0 2]
	// FLASHSPEC_ERR_OUT_OF_RANGE: DraftSupportProbs: 6 entries for DraftSupportOffsets[3] = 7
	// true batch->draft_support_probs
}
