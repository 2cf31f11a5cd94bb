package flashspec_test

import (
	"fmt"

	flashspec "github.com/flashspec/flashspec/bindings/go"
)

// The sampling-controls snippet of bindings/README.md (Go section): a token
// mask, a logit bias and top-k on the target rows, and the emitted tokens'
// logprobs.
func ExampleSamplingControls() {
	ctx, err := flashspec.NewContext(&flashspec.ContextOptions{Backend: flashspec.BackendCPU, Seed: 1})
	if err != nil {
		panic(err)
	}
	defer ctx.Close()
	w := []float32{1, 0, 0, 1, -1, 0, 0, -1} // [V = 4, d = 2]
	head, err := ctx.NewLMHead(w, 4, 2)
	if err != nil {
		panic(err)
	}
	defer head.Close()

	// Both target rows allow tokens 0 and 2 only; token 0 gets a bias of 1.5.
	allowed := []bool{true, false, true, false}
	mask, err := flashspec.PackTokenMask([][]bool{allowed, allowed}, 4)
	if err != nil {
		panic(err)
	}
	controls := &flashspec.SamplingControls{TokenMask: mask, TopK: []int32{2}}
	controls.SetLogitBias([]map[int32]float32{{0: 1.5}})
	batch := &flashspec.VerifyBatch{
		DraftOffsets: []int32{0, 1}, // one request, one draft: two target rows
		DraftTokens:  []int32{0},
		TargetHidden: []float32{0, 3, -2, 0},
		Temperatures: []float32{0},
		Controls:     controls,
		Logprobs:     true,
		TopLogprobs:  2,
	}
	res, err := ctx.VerifyAndFinalize(head, batch)
	if err != nil {
		panic(err)
	}
	// T = 0: greedy over the allowed tokens with the bias added (raw
	// greedy would give 1 and 2).
	fmt.Println("emitted:", res.Tokens(0), "logprobs:", res.TokenLogprobs(0, false))
	fmt.Printf("raw logprobs: %.3f\n", res.TokenLogprobs(0, true))
	top, logprobs := res.Top(0, 0)
	fmt.Printf("row 0 by raw logit: %v %.3f\n", top, logprobs)

	// One mask row for two target rows is refused before the call.
	controls.TokenMask = mask[:1]
	_, err = ctx.VerifyAndFinalize(head, batch)
	fmt.Println(err)
	// Output:
	// emitted: [0 2] logprobs: [0 0]
	// raw logprobs: [-3.097 -0.254]
	// row 0 by raw logit: [1 0] [-0.097 -3.097]
	// FLASHSPEC_ERR_OUT_OF_RANGE: Controls.TokenMask: 1 words for 2 rows of 1 words
}
