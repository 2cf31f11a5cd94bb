package flashspec

import (
	"errors"
	"math"
	"math/rand"
	"strings"
	"testing"
)

// Sparse draft distributions and stochastic trees on the CPU backend: a
// sparse chain given as a tree emits what it emits as a chain; at T = 0 a
// stochastic tree follows the argmax walk, at T > 0 its accepted path is a
// path of the tree; support slices the library would read past their end
// are refused before the call; the library's own refusals surface as its
// statuses.

// withSupports gives each draft of b a sparse q: `width` distinct tokens,
// the drafted one among them, with random probabilities summing to 1.
func withSupports(r *rand.Rand, b *VerifyBatch, width int) *VerifyBatch {
	offsets := []int32{0}
	var tokens []int32
	var probs []float32
	for _, drafted := range b.DraftTokens {
		support := []int32{drafted}
		for _, t := range r.Perm(testV) {
			if len(support) == width {
				break
			}
			if int32(t) != drafted {
				support = append(support, int32(t))
			}
		}
		r.Shuffle(len(support), func(i, j int) { support[i], support[j] = support[j], support[i] })
		weights, sum := make([]float64, width), 0.0
		for i := range weights {
			weights[i] = 0.05 + r.Float64()
			sum += weights[i]
		}
		for i := range weights {
			probs = append(probs, float32(weights[i]/sum))
		}
		tokens = append(tokens, support...)
		offsets = append(offsets, int32(len(tokens)))
	}
	b.DraftSupportOffsets, b.DraftSupportTokens, b.DraftSupportProbs = offsets, tokens, probs
	return b
}

func ones(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

func TestSparseChainAsTreeEmitsTheChainsTokens(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	head := newHead(t, ctx, w)
	const requests = 24
	chain, parents, _ := raggedBatch(rand.New(rand.NewSource(6)), w, requests, false, ones(requests))
	withSupports(rand.New(rand.NewSource(7)), chain, 4)
	asChain, err := ctx.VerifyAndFinalize(head, chain)
	if err != nil {
		t.Fatal(err)
	}
	tree := *chain
	tree.DraftParents = parents
	asTree, err := ctx.VerifyAndFinalize(head, &tree)
	if err != nil {
		t.Fatal(err)
	}
	accepted := 0
	for q := 0; q < requests; q++ {
		if !equal(asChain.Tokens(q), asTree.Tokens(q)) {
			t.Fatalf("request %d: as a chain %v, as a tree %v", q, asChain.Tokens(q), asTree.Tokens(q))
		}
		for k, node := range asTree.Nodes(q) {
			if int(node) != k {
				t.Fatalf("request %d: a chain's path %v", q, asTree.Nodes(q))
			}
		}
		accepted += int(asChain.AcceptedCounts[q])
	}
	if accepted == 0 {
		t.Fatal("no draft accepted: the comparison would not test the walk")
	}
}

func TestStochasticTreeAtZeroTemperatureIsTheArgmaxWalk(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	head := newHead(t, ctx, w)
	const requests = 16
	b, parents, _ := raggedBatch(rand.New(rand.NewSource(5)), w, requests, true, make([]float32, requests))
	withSupports(rand.New(rand.NewSource(8)), b, 3)
	res, err := ctx.VerifyAndFinalize(head, b)
	if err != nil {
		t.Fatal(err)
	}
	depth := 0
	for q := 0; q < requests; q++ {
		tokens, nodes := greedyTreeWalk(w, b, parents, q)
		if !equal(res.Tokens(q), tokens) || !equal(res.Nodes(q), nodes) {
			t.Fatalf("request %d: emitted %v over %v, the walk %v over %v", q, res.Tokens(q), res.Nodes(q), tokens, nodes)
		}
		if len(nodes) > depth {
			depth = len(nodes)
		}
	}
	if depth < 2 {
		t.Fatal("no path went two nodes deep: the walk would not test the verify")
	}
}

// checkPath fails unless request q's accepted nodes go down the tree from
// the root, each emitted token the drafted token of its node.
func checkPath(t *testing.T, b *VerifyBatch, res *VerifyResult, q int) {
	t.Helper()
	start := int(b.DraftOffsets[q])
	nodes, tokens := res.Nodes(q), res.Tokens(q)
	if len(nodes) != len(tokens)-1 {
		t.Fatalf("request %d: %d nodes for %d tokens", q, len(nodes), len(tokens))
	}
	parent := int32(-1)
	for k, node := range nodes {
		if node < 0 || int(node) >= int(b.DraftOffsets[q+1])-start || b.DraftParents[start+int(node)] != parent {
			t.Fatalf("request %d: path %v leaves the tree %v at step %d", q, nodes, b.DraftParents[start:b.DraftOffsets[q+1]], k)
		}
		if tokens[k] != b.DraftTokens[start+int(node)] {
			t.Fatalf("request %d: token %d is %d, node %d drafted %d", q, k, tokens[k], node, b.DraftTokens[start+int(node)])
		}
		parent = node
	}
	for slot := start + q + len(tokens); slot < int(b.DraftOffsets[q+1])+q+1; slot++ {
		if res.EmittedTokens[slot] != -1 || res.AcceptedNodes[slot] != -1 {
			t.Fatalf("request %d: slot %d past its tokens holds %d, node %d", q, slot, res.EmittedTokens[slot], res.AcceptedNodes[slot])
		}
	}
}

func TestStochasticTreePathIsAPathOfTheTree(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	head := newHead(t, ctx, w)
	r := rand.New(rand.NewSource(9))
	// Three root candidates (the last repeats the first's token and q), each
	// with one child; then the same with dense draft logits.
	parents := []int32{-1, -1, -1, 0, 1, 2}
	depths := map[int]int{}
	for trial := 0; trial < 40; trial++ {
		hidden := randomRows(r, 7, testD)
		// Root candidates are random (often rejected), their children the
		// argmax of their rows (often accepted): paths of every depth.
		tokens := make([]int32, 6)
		for k := range tokens {
			tokens[k] = int32(r.Intn(testV))
			if parents[k] >= 0 {
				tokens[k] = int32(argmax(logits(w, hidden, int(parents[k])+1)))
			}
		}
		tokens[2] = tokens[0]
		b := &VerifyBatch{DraftOffsets: []int32{0, 6}, DraftTokens: tokens, TargetHidden: hidden, DraftParents: parents,
			Temperatures: []float32{1}, RequestIDs: []uint64{uint64(trial)}}
		if trial%2 == 0 {
			withSupports(r, b, 5)
			so, st, sp := b.DraftSupportOffsets, b.DraftSupportTokens, b.DraftSupportProbs
			copy(st[so[2]:so[3]], st[so[0]:so[1]])
			copy(sp[so[2]:so[3]], sp[so[0]:so[1]])
		} else {
			b.DraftLogits = randomRows(r, 6, testV)
			copy(b.DraftLogits[2*testV:3*testV], b.DraftLogits[:testV])
		}
		res, err := ctx.VerifyAndFinalize(head, b)
		if err != nil {
			t.Fatal(err)
		}
		checkPath(t, b, res, 0)
		depths[len(res.Nodes(0))]++
	}
	if depths[0] == 0 || depths[2] == 0 {
		t.Fatalf("path depths %v: the walk never stopped at the root or never reached a leaf", depths)
	}
}

// sparseBatch is one request of two drafts, each with a support of 3 tokens.
func sparseBatch() *VerifyBatch {
	r := rand.New(rand.NewSource(11))
	return &VerifyBatch{DraftOffsets: []int32{0, 2}, DraftTokens: []int32{4, 9},
		TargetHidden: randomRows(r, 3, testD), Temperatures: []float32{1},
		DraftSupportOffsets: []int32{0, 3, 6}, DraftSupportTokens: []int32{1, 4, 7, 9, 2, 30},
		DraftSupportProbs: []float32{0.25, 0.5, 0.25, 0.5, 0.25, 0.25}}
}

func TestShortSupportSlicesAreRefused(t *testing.T) {
	for _, c := range []struct {
		want   string
		mutate func(b *VerifyBatch)
	}{
		{"DraftSupportOffsets: 2 entries for DraftOffsets[R] + 1 = 3", func(b *VerifyBatch) { b.DraftSupportOffsets = b.DraftSupportOffsets[:2] }},
		{"DraftSupportOffsets: 0 entries for DraftOffsets[R] + 1 = 3", func(b *VerifyBatch) { b.DraftSupportOffsets = []int32{} }},
		{"DraftSupportTokens: 5 entries for DraftSupportOffsets[2] = 6", func(b *VerifyBatch) { b.DraftSupportTokens = b.DraftSupportTokens[:5] }},
		{"DraftSupportProbs: 5 entries for DraftSupportOffsets[2] = 6", func(b *VerifyBatch) { b.DraftSupportProbs = b.DraftSupportProbs[:5] }},
		{"DraftSupportTokens: 6 entries for DraftSupportOffsets[2] = 7", func(b *VerifyBatch) { b.DraftSupportOffsets[2] = 7 }},
		{"DraftSupportOffsets[2]: -1, below 0", func(b *VerifyBatch) { b.DraftSupportOffsets[2] = -1 }},
	} {
		t.Run(c.want, func(t *testing.T) {
			ctx, head, _ := newFixture(t)
			b := sparseBatch()
			c.mutate(b)
			res, err := ctx.VerifyAndFinalize(head, b)
			if res != nil {
				t.Fatalf("a result %+v", res)
			}
			refusedBeforeTheCall(t, ctx, err, c.want)
			summaries, err := ctx.NewSummaries(16, 4)
			if err != nil {
				t.Fatal(err)
			}
			defer summaries.Close()
			refusedBeforeTheCall(t, ctx, ctx.Verify(head, b, summaries), c.want)
		})
	}
	// The unmodified batch goes through, and longer slices keep their tails.
	ctx, head, _ := newFixture(t)
	b := sparseBatch()
	if _, err := ctx.VerifyAndFinalize(head, b); err != nil {
		t.Fatal(err)
	}
	b.DraftSupportOffsets = append(b.DraftSupportOffsets, 99)
	b.DraftSupportTokens = append(b.DraftSupportTokens, -5)
	b.DraftSupportProbs = append(b.DraftSupportProbs, float32(math.NaN()))
	if _, err := ctx.VerifyAndFinalize(head, b); err != nil {
		t.Fatal(err)
	}
}

func TestLibraryRefusesBadSupports(t *testing.T) {
	for _, c := range []struct {
		status   Status
		argument string
		detail   string
		mutate   func(b *VerifyBatch)
	}{
		{ErrNullPointer, "batch->draft_support_tokens", "is NULL", func(b *VerifyBatch) { b.DraftSupportTokens = nil }},
		{ErrNullPointer, "batch->draft_support_offsets", "is NULL", func(b *VerifyBatch) { b.DraftSupportOffsets = nil }},
		{ErrInvalidArgument, "batch->draft_support_offsets", "not both", func(b *VerifyBatch) { b.DraftLogits = make([]float32, 2*testV) }},
		{ErrInvalidArgument, "batch->draft_support_tokens", "names token 4 twice", func(b *VerifyBatch) { b.DraftSupportTokens[0] = 4 }},
		{ErrInvalidArgument, "batch->draft_support_probs", "sums to", func(b *VerifyBatch) { b.DraftSupportProbs[0] = 0.35 }},
		{ErrInvalidArgument, "batch->draft_support_probs", "negative", func(b *VerifyBatch) {
			b.DraftSupportProbs[0], b.DraftSupportProbs[1] = -0.25, 1
		}},
		{ErrNonFinite, "batch->draft_support_probs", "not finite", func(b *VerifyBatch) { b.DraftSupportProbs[4] = float32(math.Inf(1)) }},
		{ErrInvalidArgument, "batch->draft_tokens", "not in its row's draft support", func(b *VerifyBatch) { b.DraftTokens[1] = 3 }},
		{ErrInvalidArgument, "batch->draft_tokens", "q = 0", func(b *VerifyBatch) {
			b.DraftSupportProbs[0], b.DraftSupportProbs[1], b.DraftSupportProbs[2] = 0.5, 0, 0.5
		}},
		{ErrOutOfRange, "batch->draft_support_tokens", "outside [0, 40)", func(b *VerifyBatch) { b.DraftSupportTokens[5] = testV }},
		{ErrOutOfRange, "batch->draft_support_offsets", "entry 0 must be 0", func(b *VerifyBatch) { b.DraftSupportOffsets[0] = 1 }},
		{ErrOutOfRange, "batch->draft_support_offsets", "expected 1..64", func(b *VerifyBatch) {
			wide := MaxDraftSupport + 1
			b.DraftSupportOffsets = []int32{0, int32(wide), int32(wide + 1)}
			b.DraftSupportTokens, b.DraftSupportProbs = make([]int32, wide+1), make([]float32, wide+1)
			for i := 0; i < wide; i++ {
				b.DraftSupportTokens[i], b.DraftSupportProbs[i] = int32(i%testV), 1/float32(wide)
			}
			b.DraftSupportTokens[wide], b.DraftSupportProbs[wide] = 9, 1
		}},
	} {
		t.Run(c.argument+" "+c.detail, func(t *testing.T) {
			ctx, head, _ := newFixture(t)
			b := sparseBatch()
			c.mutate(b)
			res, err := ctx.VerifyAndFinalize(head, b)
			var e *Error
			if res != nil || !errors.As(err, &e) || e.Status != c.status ||
				!strings.HasPrefix(e.Message, c.argument) || !strings.Contains(e.Message, c.detail) {
				t.Fatalf("got %v, %v; want %v naming %s (%q)", res, err, c.status, c.argument, c.detail)
			}
		})
	}
}

func TestShardCallsRefuseSparseSupports(t *testing.T) {
	ctx := newShardContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	heads := shardHeads(t, ctx, w, shardCuts[1])
	err := ctx.VerifyShard(heads[0], sparseBatch(), make([]byte, 3*ShardRecordBytes))
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "draft_support") {
		t.Fatalf("got %v, want ErrUnsupported naming the supports", err)
	}
}

func TestSparseSupportConstantsAreTheHeaders(t *testing.T) {
	if MaxDraftSupport != 64 || DraftSupportTolerance != 1e-3 {
		t.Fatal(MaxDraftSupport, DraftSupportTolerance)
	}
}
