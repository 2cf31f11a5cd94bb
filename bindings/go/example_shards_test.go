package flashspec_test

import (
	"errors"
	"fmt"

	flashspec "github.com/flashspec/flashspec/bindings/go"
)

// The vocabulary-shards snippet of bindings/README.md (Go section): a tree
// of drafts verified on three ranks' slices of the LM head, the records
// gathered in rank order, and the same tokens as on the whole head.
func ExampleContext_FinalizeShards() {
	ctx, err := flashspec.NewContext(&flashspec.ContextOptions{Backend: flashspec.BackendCPU, Seed: 3})
	if err != nil {
		panic(err)
	}
	defer ctx.Close()

	const V, d = 6, 2
	w := []float32{1, 0, 0, 1, -1, 0, 0, -1, 1, 1, -1, -1} // token t scores hidden · W[t]
	// One request, three drafts as a tree: nodes 0 and 1 are children of the
	// root, node 2 a child of node 0. Target rows: the root's, then one per node.
	batch := &flashspec.VerifyBatch{
		DraftOffsets: []int32{0, 3},
		DraftTokens:  []int32{4, 0, 1},
		DraftParents: []int32{-1, -1, 0},
		TargetHidden: []float32{3, 1, -1, 2, 2, -3, -2, 1},
		Temperatures: []float32{0},
	}
	head, err := ctx.NewLMHead(w, V, d)
	if err != nil {
		panic(err)
	}
	defer head.Close()
	whole, err := ctx.VerifyAndFinalize(head, batch)
	if err != nil {
		panic(err)
	}

	bounds := []int{0, 2, 5, V} // three ranks, uneven slices
	const rows = 4              // DraftOffsets[R] + R
	n := rows * flashspec.ShardRecordBytes
	gathered := make([]byte, 3*n)
	var shards []*flashspec.LMHead
	for rank := 0; rank < 3; rank++ { // on rank `rank`, with its slice
		begin, end := bounds[rank], bounds[rank+1]
		shard, err := ctx.NewLMHeadShard(w[begin*d:end*d], end-begin, d, begin, V)
		if err != nil {
			panic(err)
		}
		defer shard.Close()
		shards = append(shards, shard)
		if err := ctx.VerifyShard(shard, batch, gathered[rank*n:(rank+1)*n]); err != nil {
			panic(err)
		}
	}
	// After the all-gather of the records, any rank finalizes.
	result, err := ctx.FinalizeShards(shards[0], batch, gathered, 3)
	if err != nil {
		panic(err)
	}
	fmt.Println("whole:", whole.Tokens(0), "sharded:", result.Tokens(0), "path:", result.Nodes(0))

	// Ranks out of order do not tile the vocabulary: the library's error.
	swapped := append(append(append([]byte{}, gathered[2*n:]...), gathered[n:2*n]...), gathered[:n]...)
	_, err = ctx.FinalizeShards(shards[0], batch, swapped, 3)
	fmt.Println(errors.Is(err, flashspec.ErrInvalidArgument))
	// A gather one byte short is refused before the call.
	_, err = ctx.FinalizeShards(shards[0], batch, gathered[:3*n-1], 3)
	fmt.Println(err)
	// Output:
	// whole: [4 1 2] sharded: [4 1 2] path: [0 2]
	// true
	// FLASHSPEC_ERR_OUT_OF_RANGE: records: 575 bytes, expected 3 shards × 4 rows × 48
}
