package flashspec_test

import (
	"fmt"

	flashspec "github.com/flashspec/flashspec/bindings/go"
)

// The 8-bit LM head snippet of bindings/README.md: a float32 W quantised by
// the library, and int8 codes with one scale per vocabulary row.
func ExampleContext_NewLMHeadQuantized() {
	ctx, err := flashspec.NewContext(&flashspec.ContextOptions{Backend: flashspec.BackendCPU})
	if err != nil {
		panic(err)
	}
	defer ctx.Close()

	// W is [V = 4, d = 2]; each row is stored as e4m3 codes and a scale.
	w := []float32{1, 0, 0, 1, -1, 0, 0, -1}
	head, err := ctx.NewLMHeadQuantized(w, 4, 2, flashspec.DtypeE4M3)
	if err != nil {
		panic(err)
	}
	defer head.Close()
	tokens, _, err := ctx.Draft(head, []float32{0, 3}, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(head.Dtype(), "draft:", tokens)

	// Codes already quantised: row v's weights are scales[v] * codes.
	codes := []int8{127, 0, 0, 127, -127, 0, 0, -127}
	scales := []float32{0.5, 0.25, 0.5, 0.25}
	head8, err := ctx.NewLMHeadInt8Codes(codes, scales, 4, 2)
	if err != nil {
		panic(err)
	}
	defer head8.Close()
	tokens, scores, err := ctx.Draft(head8, []float32{2, 1}, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(head8.Dtype(), "draft:", tokens, "logit:", scores)

	_, err = ctx.NewLMHeadInt8Codes(codes, scales[:3], 4, 2)
	fmt.Println(err)
	// Output:
	// e4m3 draft: [1]
	// i8 draft: [0] logit: [127]
	// FLASHSPEC_ERR_INVALID_ARGUMENT: scales: must be [V, 1] = [4, 1], got [3, 1]
}
