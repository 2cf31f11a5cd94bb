package flashspec_test

import (
	"fmt"

	flashspec "github.com/flashspec/flashspec/bindings/go"
)

// The snippet of bindings/README.md (Go section): draft greedily over a
// 4-token vocabulary, then verify that draft.
func Example() {
	ctx, err := flashspec.NewContext(&flashspec.ContextOptions{Backend: flashspec.BackendCPU, Seed: 1})
	if err != nil {
		panic(err)
	}
	defer ctx.Close()

	// W is [V = 4, d = 2]: token t scores hidden · W[t].
	w := []float32{1, 0, 0, 1, -1, 0, 0, -1}
	head, err := ctx.NewLMHead(w, 4, 2)
	if err != nil {
		panic(err)
	}
	defer head.Close()

	tokens, _, err := ctx.Draft(head, []float32{0, 3}, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("draft:", tokens)

	// One request, one draft token, two target rows (the draft's and the bonus').
	res, err := ctx.VerifyAndFinalize(head, &flashspec.VerifyBatch{
		DraftOffsets: []int32{0, 1},
		DraftTokens:  tokens,
		TargetHidden: []float32{0, 3, -2, 0},
		Temperatures: []float32{0},
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("accepted:", res.AcceptedCounts[0], "emitted:", res.Tokens(0))

	_, err = ctx.NewLMHead(w, 4, 3)
	fmt.Println(err)
	// Output:
	// draft: [1]
	// accepted: 1 emitted: [1 2]
	// FLASHSPEC_ERR_OUT_OF_RANGE: weight: 8 values for [4, 3]
}
