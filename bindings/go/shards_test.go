package flashspec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"
)

// Vocabulary shards and tree verify on the CPU backend: ranks are simulated
// in one process, each with the head of its slice of one weight matrix, the
// records gathered into one []byte in rank order (what an all-gather
// gives). A sharded verify emits what the unsharded one does, sharded
// drafts equal unsharded drafts; records the library would overrun are
// refused before the call; malformed gathers are the library's error.

// The global token boundaries of 1, 2 and 3 ranks, cut unevenly (a slice of
// a single token too).
var shardCuts = [][]int{{0, testV}, {0, 13, testV}, {0, 1, 29, testV}}

// The int32 version field of a record (flashspec.h's layout).
const recordVersionOffset = 32

func newShardContext(t *testing.T) *Context {
	t.Helper()
	ctx, err := NewContext(&ContextOptions{Backend: BackendCPU, Seed: 4321, CPUThreads: 2, MaxRows: 256, MaxRequests: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	return ctx
}

func newHead(t *testing.T, ctx *Context, w []float32) *LMHead {
	t.Helper()
	head, err := ctx.NewLMHead(w, testV, testD)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { head.Close() })
	return head
}

// shardHeads uploads one head per slice of cut.
func shardHeads(t *testing.T, ctx *Context, w []float32, cut []int) []*LMHead {
	t.Helper()
	var heads []*LMHead
	for k := 0; k+1 < len(cut); k++ {
		begin, end := cut[k], cut[k+1]
		head, err := ctx.NewLMHeadShard(w[begin*testD:end*testD], end-begin, testD, begin, testV)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { head.Close() })
		heads = append(heads, head)
	}
	return heads
}

// gatherVerify runs every rank's VerifyShard into its part of one buffer.
func gatherVerify(t *testing.T, ctx *Context, heads []*LMHead, b *VerifyBatch, rows int) []byte {
	t.Helper()
	gathered := make([]byte, len(heads)*rows*ShardRecordBytes)
	for rank, head := range heads {
		if err := ctx.VerifyShard(head, b, gathered[rank*rows*ShardRecordBytes:(rank+1)*rows*ShardRecordBytes]); err != nil {
			t.Fatal(err)
		}
	}
	return gathered
}

func gatherDraft(t *testing.T, ctx *Context, heads []*LMHead, hidden []float32, o *DraftOptions) []byte {
	t.Helper()
	rows := len(hidden) / testD
	gathered := make([]byte, len(heads)*rows*ShardRecordBytes)
	for rank, head := range heads {
		if err := ctx.DraftShard(head, hidden, gathered[rank*rows*ShardRecordBytes:(rank+1)*rows*ShardRecordBytes], o); err != nil {
			t.Fatal(err)
		}
	}
	return gathered
}

// raggedBatch has requests of 0..4 drafts each: three drafts in four are
// the argmax of the target row that scores them (so many are accepted), the
// rest random. Trees get random parents; a chain's parents (returned, not
// set on the batch) are k - 1.
func raggedBatch(r *rand.Rand, w []float32, requests int, tree bool, temperatures []float32) (b *VerifyBatch, parents []int32, rows int) {
	offsets := []int32{0}
	for i := 0; i < requests; i++ {
		offsets = append(offsets, offsets[i]+int32(r.Intn(5)))
	}
	rows = int(offsets[requests]) + requests
	hidden := randomRows(r, rows, testD)
	for i := range hidden {
		hidden[i] *= 3
	}
	var drafts []int32
	for q := 0; q < requests; q++ {
		base := int(offsets[q]) + q
		for k := 0; k < int(offsets[q+1]-offsets[q]); k++ {
			parent := k - 1
			if tree && k > 0 {
				parent = r.Intn(k+1) - 1
			}
			parents = append(parents, int32(parent))
			token := int32(r.Intn(testV))
			if r.Float64() < 0.75 {
				token = int32(argmax(logits(w, hidden, base+parent+1)))
			}
			drafts = append(drafts, token)
		}
	}
	steps := make([]uint64, requests)
	for i := range steps {
		steps[i] = 3
	}
	b = &VerifyBatch{DraftOffsets: offsets, DraftTokens: drafts, TargetHidden: hidden, Temperatures: temperatures, Steps: steps}
	if tree {
		b.DraftParents = parents
	}
	return b, parents, rows
}

// greedyTreeWalk is T = 0 tree verify by hand (flashspec.h, "Tree
// verify"): from the root, y = the argmax of the current node's row;
// descend into the first child with token y, else emit y and stop. It
// returns the emitted tokens and the accepted nodes.
func greedyTreeWalk(w []float32, b *VerifyBatch, parents []int32, q int) (tokens, nodes []int32) {
	start, n := int(b.DraftOffsets[q]), int(b.DraftOffsets[q+1]-b.DraftOffsets[q])
	base := start + q
	node := -1
	for {
		y := int32(argmax(logits(w, b.TargetHidden, base+node+1)))
		tokens = append(tokens, y)
		child := -1
		for k := 0; k < n; k++ {
			if int(parents[start+k]) == node && b.DraftTokens[start+k] == y {
				child = k
				break
			}
		}
		if child < 0 {
			return tokens, nodes
		}
		nodes = append(nodes, int32(child))
		node = child
	}
}

func TestShardRecordConstantsAreTheHeaders(t *testing.T) {
	if ShardRecordBytes != 48 || ShardRecordVersion != 1 {
		t.Fatal(ShardRecordBytes, ShardRecordVersion)
	}
}

func TestShardHeadsKnowTheirSlice(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	whole := newHead(t, ctx, w)
	if whole.VocabBegin() != 0 || whole.GlobalVocabSize() != testV || whole.VocabSize() != testV {
		t.Fatal(whole.VocabBegin(), whole.GlobalVocabSize(), whole.VocabSize())
	}
	var got []string
	for _, h := range shardHeads(t, ctx, w, shardCuts[2]) {
		got = append(got, fmt.Sprint(h.VocabBegin(), h.VocabSize(), h.GlobalVocabSize(), h.HiddenSize()))
	}
	if want := []string{"0 1 40 12", "1 28 40 12", "29 11 40 12"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatal(got)
	}
}

func TestBadSlicesAndMisusedShardHeadsAreRefused(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	_, err := ctx.NewLMHeadShard(w[:20*testD-1], 20, testD, 0, testV)
	refusedBeforeTheCall(t, ctx, err, "weight: 239 values for [20, 12]")
	for _, begin := range []int{-1, 30} { // before the vocabulary, past its end
		if _, err := ctx.NewLMHeadShard(w[:20*testD], 20, testD, begin, testV); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("vocabBegin %d: %v", begin, err)
		}
	}

	shard := shardHeads(t, ctx, w, []int{0, 20})[0]
	hidden := randomRows(rand.New(rand.NewSource(2)), 3, testD)
	var e *Error
	if _, _, err := ctx.Draft(shard, hidden, nil); !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.HasPrefix(e.Message, "head") {
		t.Fatal(err)
	}
	b := &VerifyBatch{DraftOffsets: []int32{0, 2}, DraftTokens: []int32{1, 2}, TargetHidden: hidden}
	if _, err := ctx.VerifyAndFinalize(shard, b); !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.HasPrefix(e.Message, "head") {
		t.Fatal(err)
	}
}

func TestShardedVerifyEmitsTheUnshardedTokens(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	whole := newHead(t, ctx, w)
	const requests = 24
	for _, cut := range shardCuts {
		heads := shardHeads(t, ctx, w, cut)
		for _, temperature := range []string{"0", "0.8", "mixed"} {
			for _, tree := range []bool{false, true} {
				name := fmt.Sprintf("%d ranks, T = %s, tree %v", len(heads), temperature, tree)
				temperatures := make([]float32, requests)
				for i := range temperatures {
					switch {
					case temperature == "0.8":
						temperatures[i] = 0.8
					case temperature == "mixed" && i%2 == 0:
						temperatures[i] = 1.1
					}
				}
				r := rand.New(rand.NewSource(int64(10*len(cut)) + int64(len(temperature))))
				b, _, rows := raggedBatch(r, w, requests, tree, temperatures)
				want, err := ctx.VerifyAndFinalize(whole, b)
				if err != nil {
					t.Fatal(name, err)
				}
				accepted := 0
				for _, n := range want.AcceptedCounts {
					accepted += int(n)
				}
				if accepted == 0 {
					t.Fatalf("%s: no draft accepted: the comparison would miss the acceptance test", name)
				}
				got, err := ctx.FinalizeShards(heads[0], b, gatherVerify(t, ctx, heads, b, rows), len(heads))
				if err != nil {
					t.Fatal(name, err)
				}
				if !equal(got.AcceptedCounts, want.AcceptedCounts) || !equal(got.EmittedTokens, want.EmittedTokens) ||
					fmt.Sprint(got.NextSteps) != fmt.Sprint(want.NextSteps) {
					t.Fatalf("%s:\nsharded   %v %v %v\nunsharded %v %v %v", name, got.AcceptedCounts, got.EmittedTokens,
						got.NextSteps, want.AcceptedCounts, want.EmittedTokens, want.NextSteps)
				}
				if (got.AcceptedNodes == nil) == tree || (want.AcceptedNodes == nil) == tree {
					t.Fatalf("%s: AcceptedNodes %v %v", name, got.AcceptedNodes, want.AcceptedNodes)
				}
				if !equal(got.AcceptedNodes, want.AcceptedNodes) {
					t.Fatalf("%s: accepted nodes %v, unsharded %v", name, got.AcceptedNodes, want.AcceptedNodes)
				}
			}
		}
	}
}

// An independent reference: at T = 0, whole and sharded verify are the
// argmax walk computed here (along the chain, or down the tree).
func TestGreedyVerifyIsTheArgmaxWalk(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	whole := newHead(t, ctx, w)
	heads := shardHeads(t, ctx, w, shardCuts[2])
	const requests = 16
	for _, tree := range []bool{false, true} {
		b, parents, rows := raggedBatch(rand.New(rand.NewSource(5)), w, requests, tree, make([]float32, requests))
		unsharded, err := ctx.VerifyAndFinalize(whole, b)
		if err != nil {
			t.Fatal(err)
		}
		sharded, err := ctx.FinalizeShards(heads[0], b, gatherVerify(t, ctx, heads, b, rows), len(heads))
		if err != nil {
			t.Fatal(err)
		}
		depth := 0
		for q := 0; q < requests; q++ {
			tokens, nodes := greedyTreeWalk(w, b, parents, q)
			for _, res := range []*VerifyResult{unsharded, sharded} {
				if !equal(res.Tokens(q), tokens) {
					t.Fatalf("tree %v, request %d: emitted %v, the walk %v", tree, q, res.Tokens(q), tokens)
				}
				if tree && !equal(res.Nodes(q), nodes) {
					t.Fatalf("request %d: accepted nodes %v, the walk %v", q, res.Nodes(q), nodes)
				}
				if !tree && res.Nodes(q) != nil {
					t.Fatalf("a chain batch has accepted nodes %v", res.Nodes(q))
				}
			}
			if len(nodes) > depth {
				depth = len(nodes)
			}
		}
		if depth < 2 {
			t.Fatalf("tree %v: no path went two nodes deep: the walk would not test the verify", tree)
		}
	}
}

// The comparisons above can fail: a rank holding other weights for its
// slice (same tiling, so the records are well-formed) emits other tokens.
func TestAWrongSliceChangesTheTokens(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	const requests = 24
	b, _, rows := raggedBatch(rand.New(rand.NewSource(8)), w, requests, false, make([]float32, requests))
	want, err := ctx.VerifyAndFinalize(newHead(t, ctx, w), b)
	if err != nil {
		t.Fatal(err)
	}
	wrong := append([]float32(nil), w...)
	copy(wrong[13*testD:], randomRows(rand.New(rand.NewSource(9)), testV-13, testD))
	heads := shardHeads(t, ctx, wrong, shardCuts[1])
	got, err := ctx.FinalizeShards(heads[0], b, gatherVerify(t, ctx, heads, b, rows), len(heads))
	if err != nil {
		t.Fatal(err)
	}
	if equal(got.EmittedTokens, want.EmittedTokens) {
		t.Fatal("other weights for a slice emitted the same tokens")
	}
}

func TestShardedDraftsEqualUnshardedDrafts(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	whole := newHead(t, ctx, w)
	const rows = 12
	hidden := randomRows(rand.New(rand.NewSource(13)), rows, testD)
	perRow := &DraftOptions{Temperatures: make([]float32, rows), Seeds: make([]uint64, rows),
		RequestIDs: make([]uint64, rows), Steps: make([]uint64, rows), Positions: make([]int32, rows)}
	for i := 0; i < rows; i++ {
		if i%3 != 0 {
			perRow.Temperatures[i] = 0.9
		}
		perRow.Seeds[i], perRow.RequestIDs[i], perRow.Steps[i], perRow.Positions[i] = uint64(i+5), uint64(i%4), uint64(i), int32(i%3)
	}
	options := map[string]*DraftOptions{
		"greedy":                     nil,
		"sampled per row":            perRow,
		"sampled at one temperature": {Temperature: 1.3, Seeds: perRow.Seeds},
	}
	for _, cut := range shardCuts {
		heads := shardHeads(t, ctx, w, cut)
		for name, o := range options {
			name = fmt.Sprintf("%d ranks, %s", len(heads), name)
			tokens, scores, err := ctx.Draft(whole, hidden, o)
			if err != nil {
				t.Fatal(name, err)
			}
			argmaxes := true
			for i := 0; i < rows; i++ {
				argmaxes = argmaxes && tokens[i] == int32(argmax(logits(w, hidden, i)))
			}
			if argmaxes != (o == nil) {
				t.Fatalf("%s: drafts %v are argmaxes: %v", name, tokens, argmaxes)
			}
			gotTokens, gotScores, err := ctx.DraftFromShards(gatherDraft(t, ctx, heads, hidden, o), len(heads), rows, o)
			if err != nil {
				t.Fatal(name, err)
			}
			if !equal(gotTokens, tokens) {
				t.Fatalf("%s: sharded drafts %v, unsharded %v", name, gotTokens, tokens)
			}
			for i := range scores {
				if math.Abs(float64(gotScores[i]-scores[i])) > 1e-5*(1+math.Abs(float64(scores[i]))) {
					t.Fatalf("%s: row %d scores %v, unsharded %v", name, i, gotScores[i], scores[i])
				}
			}
		}
	}
}

func isRefusal(t *testing.T, ctx *Context, err error, want string, buffer []byte) {
	t.Helper()
	refusedBeforeTheCall(t, ctx, err, want)
	for i, v := range buffer {
		if v != 0xAB {
			t.Fatalf("byte %d of the buffer was written", i)
		}
	}
}

func sentinel(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 0xAB
	}
	return b
}

// Records too short for the rows are refused before the call, the buffer
// untouched; longer ones are written at their start only.
func TestShardRecordsAreCheckedAgainstTheRows(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	head := shardHeads(t, ctx, w, []int{0, 20})[0]
	hidden := randomRows(rand.New(rand.NewSource(3)), 3, testD)
	b := &VerifyBatch{DraftOffsets: []int32{0, 2}, DraftTokens: []int32{5, 6}, TargetHidden: hidden}
	buffer := sentinel(5 * ShardRecordBytes)
	for _, n := range []int{0, 1, 3*ShardRecordBytes - 1, 2 * ShardRecordBytes} {
		want := fmt.Sprintf("records: %d bytes, fewer than 3 rows × 48", n)
		isRefusal(t, ctx, ctx.VerifyShard(head, b, buffer[:n]), want, buffer)
		isRefusal(t, ctx, ctx.DraftShard(head, hidden, buffer[:n], &DraftOptions{Temperature: 0.5}), want, buffer)
	}
	for _, n := range []int{3 * ShardRecordBytes, 3*ShardRecordBytes + 1, 5 * ShardRecordBytes} {
		for call, write := range map[string]func([]byte) error{
			"VerifyShard": func(r []byte) error { return ctx.VerifyShard(head, b, r) },
			"DraftShard":  func(r []byte) error { return ctx.DraftShard(head, hidden, r, nil) },
		} {
			buffer := sentinel(5 * ShardRecordBytes)
			if err := write(buffer[:n]); err != nil {
				t.Fatal(call, n, err)
			}
			for row := 0; row < 3; row++ {
				field := buffer[row*ShardRecordBytes+recordVersionOffset:]
				if v := int(int32(binary.LittleEndian.Uint32(field))); v != ShardRecordVersion {
					t.Fatalf("%s into %d bytes: row %d has version %d", call, n, row, v)
				}
			}
			for i, v := range buffer[3*ShardRecordBytes:] {
				if v != 0xAB {
					t.Fatalf("%s into %d bytes wrote byte %d past the rows", call, n, 3*ShardRecordBytes+i)
				}
			}
		}
	}
}

// Gathered records must be exactly numShards × rows records.
func TestGatheredRecordsAreCheckedExactly(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	heads := shardHeads(t, ctx, w, shardCuts[1])
	hidden := randomRows(rand.New(rand.NewSource(3)), 3, testD)
	b := &VerifyBatch{DraftOffsets: []int32{0, 2}, DraftTokens: []int32{5, 6}, TargetHidden: hidden, Temperatures: []float32{0}}
	verified := gatherVerify(t, ctx, heads, b, 3)
	drafted := gatherDraft(t, ctx, heads, hidden, nil)
	for _, c := range []struct {
		records   []byte
		numShards int
		want      string
	}{
		{verified[:len(verified)-1], 2, "records: 287 bytes, expected 2 shards × 3 rows × 48"},
		{append(append([]byte(nil), verified...), 0), 2, "records: 289 bytes, expected 2 shards × 3 rows × 48"},
		{append(append([]byte(nil), verified...), make([]byte, 2*ShardRecordBytes)...), 2, "records: 384 bytes, expected 2 shards × 3 rows × 48"},
		{verified, 3, "records: 288 bytes, expected 3 shards × 3 rows × 48"},
		{verified, 0, "numShards: 0, outside [1, 2^31)"},
		{nil, 1, "records: 0 bytes, expected 1 shards × 3 rows × 48"},
	} {
		res, err := ctx.FinalizeShards(heads[0], b, c.records, c.numShards)
		if res != nil {
			t.Fatal(res)
		}
		refusedBeforeTheCall(t, ctx, err, c.want)
		_, _, err = ctx.DraftFromShards(c.records, c.numShards, 3, nil)
		refusedBeforeTheCall(t, ctx, err, c.want)
	}
	_, _, err := ctx.DraftFromShards(drafted, 2, 0, nil)
	refusedBeforeTheCall(t, ctx, err, "rows: 0, outside [1, 2^31)")
	_, _, err = ctx.DraftFromShards(drafted, 2, 3, &DraftOptions{Seeds: []uint64{1, 2}})
	refusedBeforeTheCall(t, ctx, err, "Seeds: 2 entries for 3 rows")
	// The batch itself is checked as for Finalize.
	_, err = ctx.FinalizeShards(heads[0], &VerifyBatch{DraftOffsets: []int32{0, 2}, DraftTokens: []int32{5}, TargetHidden: hidden}, verified, 2)
	refusedBeforeTheCall(t, ctx, err, "DraftTokens: 1 entries for DraftOffsets[R] = 2")
	// The exact gathers go through.
	if _, err := ctx.FinalizeShards(heads[0], b, verified, 2); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ctx.DraftFromShards(drafted, 2, 3, nil); err != nil {
		t.Fatal(err)
	}
}

// malformed gives gathers of well-formed records of numShards ranks that
// are not a gather the library may merge.
func malformed(records []byte, rows, numShards int) map[string]struct {
	records   []byte
	numShards int
} {
	per := rows * ShardRecordBytes
	rank := func(k int) []byte { return records[k*per : (k+1)*per] }
	versioned := append([]byte(nil), records...)
	binary.LittleEndian.PutUint32(versioned[per+2*ShardRecordBytes+recordVersionOffset:], uint32(ShardRecordVersion+1))
	var reversed, twice []byte
	for k := numShards - 1; k >= 0; k-- {
		reversed = append(reversed, rank(k)...)
	}
	twice = append(append(append(append(twice, rank(0)...), rank(1)...), rank(1)...), rank(2)...)
	return map[string]struct {
		records   []byte
		numShards int
	}{
		"another version":    {versioned, numShards},
		"ranks out of order": {reversed, numShards},
		"a rank missing":     {append([]byte(nil), records[:2*per]...), numShards - 1},
		"a rank twice":       {twice, numShards + 1},
	}
}

func TestMalformedGathersAreTheLibrarysInvalidArgument(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	heads := shardHeads(t, ctx, w, shardCuts[2])
	hidden := randomRows(rand.New(rand.NewSource(4)), 3, testD)
	b := &VerifyBatch{DraftOffsets: []int32{0, 2}, DraftTokens: []int32{5, 6}, TargetHidden: hidden, Temperatures: []float32{0}}
	verified := gatherVerify(t, ctx, heads, b, 3)
	drafted := gatherDraft(t, ctx, heads, hidden, nil)
	for label, bad := range malformed(verified, 3, 3) {
		var e *Error
		res, err := ctx.FinalizeShards(heads[0], b, bad.records, bad.numShards)
		if res != nil || !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.HasPrefix(e.Message, "records") {
			t.Fatalf("FinalizeShards, %s: %v %v", label, res, err)
		}
	}
	for label, bad := range malformed(drafted, 3, 3) {
		var e *Error
		tokens, _, err := ctx.DraftFromShards(bad.records, bad.numShards, 3, nil)
		if tokens != nil || !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.HasPrefix(e.Message, "records") {
			t.Fatalf("DraftFromShards, %s: %v %v", label, tokens, err)
		}
	}
	// The well-formed gathers are accepted.
	if _, err := ctx.FinalizeShards(heads[0], b, verified, 3); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ctx.DraftFromShards(drafted, 3, 3, nil); err != nil {
		t.Fatal(err)
	}
}

func TestCallsNeedingASecondExchangeAreUnsupported(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	head := shardHeads(t, ctx, w, []int{0, 20})[0]
	hidden := randomRows(rand.New(rand.NewSource(3)), 3, testD)
	records := make([]byte, 3*ShardRecordBytes)
	for name, b := range map[string]*VerifyBatch{
		"draft_logits": {DraftOffsets: []int32{0, 2}, DraftTokens: []int32{5, 6}, TargetHidden: hidden, DraftLogits: make([]float32, 2*testV)},
		"logprobs":     {DraftOffsets: []int32{0, 2}, DraftTokens: []int32{5, 6}, TargetHidden: hidden, Logprobs: true},
		"controls":     {DraftOffsets: []int32{0, 2}, DraftTokens: []int32{5, 6}, TargetHidden: hidden, Controls: &SamplingControls{TopK: []int32{3}}},
	} {
		var e *Error
		if err := ctx.VerifyShard(head, b, records); !errors.As(err, &e) || e.Status != ErrUnsupported || !strings.Contains(e.Message, name) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	controls := &DraftOptions{Controls: &SamplingControls{TopK: []int32{3, 3, 3}}}
	if err := ctx.DraftShard(head, hidden, records, controls); !errors.Is(err, ErrUnsupported) || !strings.Contains(ctx.LastError(), "controls") {
		t.Fatal(err)
	}
	if _, _, err := ctx.DraftFromShards(records, 1, 3, controls); !errors.Is(err, ErrUnsupported) {
		t.Fatal(err)
	}
}

func TestTreeParentsAreChecked(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	head := newHead(t, ctx, w)
	hidden := randomRows(rand.New(rand.NewSource(3)), 3, testD)
	b := &VerifyBatch{DraftOffsets: []int32{0, 2}, DraftTokens: []int32{5, 6}, TargetHidden: hidden, DraftParents: []int32{-1}}
	_, err := ctx.VerifyAndFinalize(head, b)
	refusedBeforeTheCall(t, ctx, err, "DraftParents: 1 entries for DraftOffsets[R] = 2")
	// A parent that is not an earlier node is the library's error.
	b.DraftParents = []int32{-1, 1}
	var e *Error
	if _, err := ctx.VerifyAndFinalize(head, b); !errors.As(err, &e) || e.Status != ErrOutOfRange || !strings.Contains(e.Message, "draft_parents") {
		t.Fatal(err)
	}
	b.DraftParents = []int32{-1, -1}
	res, err := ctx.VerifyAndFinalize(head, b)
	if err != nil || len(res.AcceptedNodes) != 3 || len(res.Nodes(0)) != int(res.AcceptedCounts[0]) {
		t.Fatal(res, err)
	}
}
